"""A command's output stream, capped (container.py).

The first and last halves are kept, the middle counted and cut.
"""

from __future__ import annotations

from collections.abc import Callable


class _Capped:
    """One output stream: the first and last halves of `cap` bytes kept, the middle counted and cut."""

    def __init__(self, cap: int, listener: Callable[[bytes], None] | None = None) -> None:
        self.cap, self.total, self.listener = cap, 0, listener  # `listener` hears every chunk, uncut
        self.head, self.tail = bytearray(), bytearray()

    def add(self, chunk: bytes | None) -> None:
        if not chunk:
            return
        if self.listener is not None:
            self.listener(chunk)
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        del self.tail[: max(0, len(self.tail) - self.cap // 2)]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        if not self.cut:
            return head + tail
        return f"{head}\n[... {self.cut:,} bytes cut ...]\n{tail}"

    def note(self, stream: str) -> str | None:
        if not self.cut:
            return None
        kept = self.cap // 2
        return f"{stream}: {self.total:,} bytes, the middle {self.cut:,} cut (first and last {kept:,} kept)"
