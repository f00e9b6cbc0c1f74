"""A real image registry on 127.0.0.1 (Debian's docker-registry, the CNCF distribution server), for an
engine that can pull: the engine treats 127.0.0.0/8 registries as insecure (plain HTTP) by default.

`local_registry(folder)` serves from `folder` on a free port and yields `127.0.0.1:PORT`;
`serve_base(docker, registry, image)` puts `image` there and leaves the engine without a local copy of
the registry's name, so using it means pulling it.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.fakes.server import free_port


@contextlib.contextmanager
def local_registry(folder: Path) -> Iterator[str]:
    """A registry serving from `folder`, stopped on exit."""
    address = f"127.0.0.1:{free_port()}"
    config = folder / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: {address}\n"
    )
    log = (folder / "registry.log").open("wb")
    server = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30  # wall-time: how long it may take to start, not an assertion
        while True:
            try:
                with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
                    break
            except OSError as exc:
                if server.poll() is not None or time.monotonic() > deadline:  # wall-time: start-up limit
                    raise RuntimeError(
                        f"docker-registry did not start: {(folder / 'registry.log').read_text()}"
                    ) from exc
                time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def serve_base(docker: Any, registry: str, image: str) -> str:
    """Push `image` to `registry` under its own path; returns the registry's name for it, untagged here."""
    repository, _, tag = image.rpartition(":")
    remote = f"{registry}/{repository}"
    docker.images.get(image).tag(remote, tag)
    for line in docker.images.push(remote, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push of {image} to {registry} failed: {line['error']}")
    docker.images.remove(f"{remote}:{tag}")
    return f"{remote}:{tag}"
