"""The Redis and PostgreSQL images docs/deploy/compose.yaml names, for an engine that cannot pull them.

No registry is reachable here, so the compose lane (bench/compose_lane.py) gets `redis:7-bookworm` and
`postgres:16-bookworm` the way tests/fakes/debian_base.py gets Debian's base: a root made by mmdebstrap
(minbase, docs and man pages left out) from this machine's Debian mirror with Debian's own packages,
imported into the engine under the public name, with an entrypoint that keeps the public images'
contract as far as compose.yaml uses it:

- redis: `redis-server ARGS` as the `redis` user in /data, protected mode off (the public image builds
  it so: the container's network is the boundary, and a password, when the command gives one, still
  holds); `redis-cli` on the PATH for the health check.
- postgres: on an empty /var/lib/postgresql/data, `initdb` with POSTGRES_USER and the password of
  POSTGRES_PASSWORD_FILE (read as root, as the public entrypoint does: a compose secret is the host's
  file, 0400 root), scram-sha-256 over TCP from anywhere, then POSTGRES_DB created; then `postgres` as
  the `postgres` user listening on every address; `pg_isready` on the PATH.

Debian bookworm packages PostgreSQL 15, not 16: the image named postgres:16-bookworm here runs 15, and
says so in its labels (`conclave.stand-in`); nothing in Conclave depends on 16 (the suite runs on 15).
An image of either name already in the engine is kept.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from conclave.sandbox.image import host_apt_sources
from conclave.sandbox.recipe import DPKG_EXCLUDES, RELEASE, VARIANT

REDIS_ENTRYPOINT = """#!/bin/sh
set -eu
if [ "${1:-}" = redis-server ]; then
    shift
    # no config file named: protected mode off first, so the command's own flags come after it
    case "${1:-}" in
        ""|--*) set -- redis-server --protected-mode no "$@" ;;
        *) set -- redis-server "$@" ;;
    esac
    if [ "$(id -u)" = 0 ]; then
        chown -R redis:redis /data
        exec setpriv --reuid=redis --regid=redis --init-groups "$@"
    fi
fi
exec "$@"
"""

POSTGRES_ENTRYPOINT = """#!/bin/sh
set -eu
PGDATA=/var/lib/postgresql/data
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
export PATH="$BIN:$PATH" PGDATA
if [ "${1:-}" != postgres ]; then exec "$@"; fi
if [ "$(id -u)" = 0 ]; then
    if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
        POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
        export POSTGRES_PASSWORD
        unset POSTGRES_PASSWORD_FILE
    fi
    mkdir -p "$PGDATA" /run/postgresql
    chown -R postgres:postgres "$PGDATA" /run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE}"
    user=${POSTGRES_USER:-postgres}
    pwfile=$(mktemp)
    printf '%s\\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \\
        --encoding=UTF8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -w -o "-c listen_addresses=''" start >/dev/null
    db=${POSTGRES_DB:-$user}
    if [ "$db" != postgres ]; then createdb --username="$user" --owner="$user" "$db"; fi
    pg_ctl -w -m fast stop >/dev/null
fi
unset POSTGRES_PASSWORD
shift
exec postgres -c listen_addresses='*' "$@"
"""


@dataclass(frozen=True)
class ServiceImage:
    name: str
    packages: tuple[str, ...]
    entrypoint: str
    config: tuple[str, ...]  # `docker import --change` lines


REDIS = ServiceImage(
    "redis:7-bookworm",
    ("redis-server", "redis-tools"),
    REDIS_ENTRYPOINT,
    (
        'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]',
        'CMD ["redis-server"]',
        "WORKDIR /data",
        "VOLUME /data",
        "EXPOSE 6379",
        "LABEL conclave.stand-in=debian-bookworm-redis-server",
    ),
)
POSTGRES = ServiceImage(
    "postgres:16-bookworm",
    ("postgresql-15",),
    POSTGRES_ENTRYPOINT,
    (
        'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]',
        'CMD ["postgres"]',
        "ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VOLUME /var/lib/postgresql/data",
        "EXPOSE 5432",
        "LABEL conclave.stand-in=debian-bookworm-postgresql-15",
    ),
)


def ensure_service_image(image: ServiceImage, platform: str = "linux/amd64") -> str:
    """`image.name` in the engine, made from this machine's mirror when it is missing."""
    if subprocess.run(["docker", "image", "inspect", image.name], capture_output=True).returncode == 0:
        return image.name
    sources = host_apt_sources()
    assert sources.suite == RELEASE, f"this machine's release is {sources.suite}, the images' {RELEASE}"
    with tempfile.TemporaryDirectory(prefix="conclave-service-") as tmp:
        listing = Path(tmp) / "debian.sources"
        listing.write_text(sources.text)
        entrypoint = Path(tmp) / "docker-entrypoint.sh"
        entrypoint.write_text(image.entrypoint)
        tarball = Path(tmp) / "root.tar"
        result = subprocess.run(
            [
                "mmdebstrap",
                f"--variant={VARIANT}",
                "--include=" + ",".join(image.packages),
                "--format=tar",
                "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
                f"--customize-hook=upload {entrypoint} /usr/local/bin/docker-entrypoint.sh",
                '--customize-hook=chmod 0755 "$1/usr/local/bin/docker-entrypoint.sh"',
                '--customize-hook=mkdir -p "$1/data"',
                RELEASE,
                str(tarball),
                str(listing),
            ],
            capture_output=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"mmdebstrap for {image.name} failed:\n{result.stderr.decode()[-3000:]}")
        changes = [arg for line in image.config for arg in ("--change", line)]
        subprocess.run(
            ["docker", "import", "--platform", platform, *changes, str(tarball), image.name],
            check=True,
            capture_output=True,
        )
    return image.name


def ensure_service_images() -> list[str]:
    return [ensure_service_image(image) for image in (REDIS, POSTGRES)]


if __name__ == "__main__":
    for name in ensure_service_images():
        print(name)
