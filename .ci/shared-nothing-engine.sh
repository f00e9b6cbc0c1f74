#!/usr/bin/env bash
# A second Docker engine that reaches this host only as Docker Desktop's VM does (issue 29): its API over
# TCP (tcp://127.0.0.1:$PORT), and the folders the tests use (the lane's SHARED folder) through a FUSE
# layer, `bindfs`, which passes files but not unix sockets (a connect() through it is refused). It runs
# in a mount namespace of its own (`unshare -m`) with SHARED bindfs-mounted over itself, its own data,
# exec root, pid file and bridge, no iptables rules (the main engine's stay as they are) and its own
# cgroup parent, so host code that looks for a container's cgroup finds nothing, as on a VM engine.
# The sandbox images are copied into it from the main engine. Idempotent: an engine that answers is kept.
#
#   bash .ci/shared-nothing-engine.sh          # start it (root), then e.g.
#   DOCKER_HOST=tcp://127.0.0.1:7500 docker info
# tests/lanes/test_shared_nothing_engine.py runs the file, check, CLI-member and security tests on it.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${CONCLAVE_LANE_PORT:-7500}
ROOT=${CONCLAVE_LANE_ROOT:-/tmp/egress-engine}      # its data root, exec root, pid file and log
SHARED=${CONCLAVE_LANE_SHARED:-/tmp/egress-shared}  # the only folder it sees the tests' files in
BRIDGE=${CONCLAVE_LANE_BRIDGE:-egress-br0}
BIP=${CONCLAVE_LANE_BIP:-10.75.0.1/24}
LANE="tcp://127.0.0.1:$PORT"

say() { printf '== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

command -v bindfs >/dev/null 2>&1 || {
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq bindfs fuse3 >/dev/null
}

if ! docker -H "$LANE" info >/dev/null 2>&1; then
  say "starting the shared-nothing engine on $LANE (folders through bindfs at $SHARED)"
  mkdir -p "$ROOT/data" "$ROOT/exec" "$SHARED"
  chmod 0755 "$SHARED"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    as_root ip link add "$BRIDGE" type bridge
    as_root ip addr add "$BIP" dev "$BRIDGE"
    as_root ip link set "$BRIDGE" up
  fi
  # bindfs stays in the namespace with the engine; allow_other lets the containers' users through it
  as_root sh -c "nohup unshare -m --propagation private sh -c '
      bindfs -o allow_other,dev,suid,attr_timeout=0,entry_timeout=0,negative_timeout=0 \"$SHARED\" \"$SHARED\" &&
      exec dockerd --data-root \"$ROOT/data\" --exec-root \"$ROOT/exec\" --pidfile \"$ROOT/dockerd.pid\" \
        -H \"$LANE\" --bridge \"$BRIDGE\" --iptables=false --ip-masq=false \
        --cgroup-parent /conclave-lane --exec-opt native.cgroupdriver=cgroupfs' \
    > \"$ROOT/dockerd.log\" 2>&1 &"
  for _ in $(seq 1 60); do docker -H "$LANE" info >/dev/null 2>&1 && break; sleep 1; done
  docker -H "$LANE" info >/dev/null 2>&1 || {
    tail -20 "$ROOT/dockerd.log"; echo "the shared-nothing engine did not start" >&2; exit 1
  }
fi
say "shared-nothing engine: docker $(docker -H "$LANE" version --format '{{.Server.Version}}')"

# The sandbox images, as `conclave sandbox build --clis` tagged them on the main engine.
for tag in $(.venv/bin/python -c '
from conclave.config.models import SandboxSpec
from conclave.sandbox.clis_image import clis_tag
from conclave.sandbox.image import image_tag
print(image_tag(SandboxSpec()), clis_tag())'); do
  if ! docker -H "$LANE" image inspect "$tag" >/dev/null 2>&1; then
    say "copying $tag into the shared-nothing engine"
    docker save "$tag" | docker -H "$LANE" load >/dev/null
  fi
done
say "shared-nothing engine ready"
