"""What runs in a container, read the same way on every engine."""

from __future__ import annotations


def container_processes(container: object) -> str:
    """Every process's command line in the container, one a line, read from its /proc (Podman's `top`
    endpoint takes no `ps` options, and the image has no `ps`)."""
    script = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
    done = container.exec_run(["sh", "-c", script], user="65534:65534")  # type: ignore[attr-defined]
    return str(done.output.decode(errors="replace"))
