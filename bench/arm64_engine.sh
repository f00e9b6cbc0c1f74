#!/usr/bin/env bash
# An engine of its own for the arm64 Dockerfile route (bench/arm64_dockerfile.py), as root:
#
#   bash bench/arm64_engine.sh start    # prints the DOCKER_HOST to use
#   bash bench/arm64_engine.sh stop
#
# Docker 20.10 keeps one image per name, whatever its platform, so an arm64 `debian:bookworm-slim` in
# the main engine would take the place of the amd64 one its tests build from. This engine has its own
# data root, socket and bridge, and Debian's docker-registry on 127.0.0.1 as its Docker Hub mirror
# (`--registry-mirror`): what the bench pushes there as library/debian is what `docker pull debian`
# gives it, as a registry would. No iptables management by the engine (the main engine's rules stay
# as they are); two rules of ours let its bridge reach Debian's mirror for apt in the build, and go
# with `stop`.
set -euo pipefail

ROOT=${ARM64_ENGINE_ROOT:-/tmp/arm64-engine}
SOCKET="$ROOT/docker.sock"
REGISTRY=127.0.0.1:${ARM64_REGISTRY_PORT:-7801}
BRIDGE=arm64-br0
BIP=10.78.0.1/24
SUBNET=10.78.0.0/24
NAT=(POSTROUTING -t nat -s "$SUBNET" ! -o "$BRIDGE" -j MASQUERADE)
OUT=(FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j ACCEPT)
BACK=(FORWARD -o "$BRIDGE" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT)

say() { printf '== %s (%s)\n' "$1" "$(date +%H:%M:%S)" >&2; }

start() {
  mkdir -p "$ROOT/data" "$ROOT/exec" "$ROOT/registry"
  if ! curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1; then
    say "starting docker-registry on $REGISTRY"
    printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n' \
      "$ROOT/registry" "$REGISTRY" > "$ROOT/registry.yml"
    nohup docker-registry serve "$ROOT/registry.yml" > "$ROOT/registry.log" 2>&1 &
    echo $! > "$ROOT/registry.pid"
    for _ in $(seq 1 30); do curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1 && break; sleep 1; done
  fi
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$BIP" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  iptables -C "${NAT[@]}" 2>/dev/null || iptables -A "${NAT[@]}"
  iptables -C "${OUT[@]}" 2>/dev/null || iptables -I "${OUT[@]}"
  iptables -C "${BACK[@]}" 2>/dev/null || iptables -I "${BACK[@]}"
  if ! docker -H "unix://$SOCKET" info >/dev/null 2>&1; then
    say "starting dockerd on unix://$SOCKET (Docker Hub mirror: http://$REGISTRY)"
    nohup dockerd --data-root "$ROOT/data" --exec-root "$ROOT/exec" --pidfile "$ROOT/dockerd.pid" \
      -H "unix://$SOCKET" --bridge "$BRIDGE" --iptables=false --ip-masq=false \
      --registry-mirror "http://$REGISTRY" > "$ROOT/dockerd.log" 2>&1 &
    for _ in $(seq 1 60); do docker -H "unix://$SOCKET" info >/dev/null 2>&1 && break; sleep 1; done
    docker -H "unix://$SOCKET" info >/dev/null || { tail -20 "$ROOT/dockerd.log"; exit 1; }
  fi
  echo "unix://$SOCKET"
}

stop() {
  [ -f "$ROOT/dockerd.pid" ] && kill "$(cat "$ROOT/dockerd.pid")" 2>/dev/null || true
  [ -f "$ROOT/registry.pid" ] && kill "$(cat "$ROOT/registry.pid")" 2>/dev/null || true
  iptables -D "${NAT[@]}" 2>/dev/null || true
  iptables -D "${OUT[@]}" 2>/dev/null || true
  iptables -D "${BACK[@]}" 2>/dev/null || true
  sleep 3  # sleep-ok: dockerd releases the bridge as it exits
  ip link del "$BRIDGE" 2>/dev/null || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: bash bench/arm64_engine.sh start|stop" >&2; exit 2 ;;
esac
