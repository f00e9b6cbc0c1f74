"""The secret values of one job's members (their login tokens and keys), and where they turn up: a file
that holds one, and text that carries one.

    secrets = Secrets()
    secrets.add(login.secrets())              # every CLI member's, when the job binds it; more after each
                                              # run (a CLI may refresh its token inside its container)
    secrets.held(open(path, "rb"))            # "base64" (how it was found), or None
    secrets.redact(text)                      # each one replaced by [secret]
    secrets.scrub(event_data)                 # the same in every string of a JSON-like value
    own = secrets.member()                    # one member's: the job's values and its own
    own.add(refreshed)                        # withheld from that member's snapshots and text only

What a member's login holds on the user's machine, before any run, is the job's: withheld from every
member. What a run leaves in its login file (a token its CLI refreshed, read back by the file's format)
is the member's own: the member may have written it, so it hides only that member's work, never a peer's.

A value is found verbatim, or in one of the encodings a shell makes in one step: base64 (standard and
url-safe alphabets, at any alignment inside a longer encoded text, as `base64 FILE` or a JWT writes it)
and hex (either case, as `xxd -p` or `od` piped through `tr` writes it); line breaks are ignored for
the encodings (`base64` wraps at 76 columns). Anything else (another encoding, compression,
encryption, a value cut in pieces) is not recognised: docs/SECURITY.md says so.

The values live only in this object, in memory, for the job's life: nothing here writes them anywhere.
One object per job (coordination/job_files.py), read from worker threads (snapshots) while the event
loop adds to it: `add` replaces the needle tuple whole, so a reader sees the old set or the new one.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, Literal

from conclave.files import safe

Encoding = Literal["verbatim", "base64", "base64url", "hex"]
MIN_SECRET = 8  # shorter values would match ordinary text
MIN_FRAGMENT = 12  # the part of an encoding that depends on the secret alone
CHUNK = 1 << 20
MASK = "[secret]"


class Secrets:
    """The job's known secret values and their encodings (see the module docstring)."""

    def __init__(self, values: Iterable[str] = (), *, job: Secrets | None = None) -> None:
        self._values: frozenset[str] = frozenset()
        self._needles: tuple[tuple[bytes, Encoding], ...] = ()
        self._job = job  # a member's: the job's values count here too (`member`)
        self._merged: tuple[object, object, tuple[tuple[bytes, Encoding], ...]] | None = None
        self.add(values)

    def __repr__(self) -> str:
        return f"Secrets({len(self)} values)"  # never the values

    def __len__(self) -> int:
        return len(self._values | self._job._values) if self._job is not None else len(self._values)

    def member(self) -> Secrets:
        """A member's secrets: the job's (as they grow) and values of its own, which `add` on it keeps
        from the job's (see the module docstring)."""
        return Secrets(job=self.job)

    @property
    def job(self) -> Secrets:
        """The job's secrets, withheld from every member (this object, unless it is a member's)."""
        return self._job if self._job is not None else self

    def _all(self) -> tuple[tuple[bytes, Encoding], ...]:
        """The needles to look for: a member's own and the job's, the longest first."""
        if self._job is None:
            return self._needles
        shared, own, merged = self._job._needles, self._needles, self._merged
        if merged is not None and merged[0] is shared and merged[1] is own:
            return merged[2]
        needles = dict(shared)
        for needle, encoding in own:
            needles.setdefault(needle, encoding)
        found = tuple(sorted(needles.items(), key=lambda item: -len(item[0])))
        self._merged = (shared, own, found)  # replaced whole: a reader in a thread sees one or the other
        return found

    def add(self, values: Iterable[str]) -> None:
        """Know these values too (short ones, under MIN_SECRET characters, are ignored)."""
        new = {value.strip() for value in values} - self._values
        new = {value for value in new if len(value) >= MIN_SECRET}
        if not new:
            return
        needles = dict(self._needles)
        for value in sorted(new):
            for needle, encoding in _encodings(value.encode()):
                needles.setdefault(needle, encoding)
        # the longest first: a verbatim value wins over a fragment of its own encoding
        self._needles = tuple(sorted(needles.items(), key=lambda item: -len(item[0])))
        self._values = self._values | new

    def found(self, data: bytes) -> Encoding | None:
        """How a known value appears in `data` (verbatim, or its encoding), or None."""
        needles = self._all()
        for needle, encoding in needles:
            if needle in data:
                return encoding
        if b"\n" in data or b"\r" in data:  # an encoding wrapped over lines
            flat = data.translate(None, b"\r\n")
            for needle, encoding in needles:
                if encoding != "verbatim" and needle in flat:
                    return encoding
        return None

    def held(self, stream: BinaryIO) -> Encoding | None:
        """`found` over a whole file, read a chunk at a time (a value across two chunks included)."""
        needles = self._all()
        if not needles:
            return None
        keep = 2 * max(len(needle) for needle, _ in needles)  # room for line breaks inside one
        tail = b""
        while chunk := stream.read(CHUNK):
            data = tail + chunk
            hit = self.found(data)
            if hit is not None:
                return hit
            tail = data[-keep:]
        return None

    def scrub(self, value: Any) -> Any:
        """A JSON-like value (an event's data, a decision) with `redact` applied to every string in it."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(str(key)): self.scrub(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(item) for item in value]
        return value

    def redact(self, text: str) -> str:
        """`text` with every known value (and its encodings) replaced by MASK."""
        needles = self._all()
        if not needles:
            return text
        for needle, _ in needles:
            shown = needle.decode("utf-8", "replace")
            if shown in text:
                text = text.replace(shown, MASK)
        return text


def _encodings(secret: bytes) -> Iterable[tuple[bytes, Encoding]]:
    yield secret, "verbatim"
    hexed = binascii.hexlify(secret)
    yield hexed, "hex"
    yield hexed.upper(), "hex"
    for fragment in _base64_fragments(secret, base64.b64encode):
        yield fragment, "base64"
    for fragment in _base64_fragments(secret, base64.urlsafe_b64encode):
        yield fragment, "base64url"


def _base64_fragments(secret: bytes, encode: Callable[[bytes], bytes]) -> Iterable[bytes]:
    """The characters of the secret's base64 that depend on it alone, at each of the three alignments it
    may have inside a longer text: `shift` bytes before it share its first group of four."""
    for shift in range(3):
        encoded = encode(b"\0" * shift + secret)
        start = (0, 2, 3)[shift]  # the first character whose six bits all come from the secret
        end = 8 * (shift + len(secret)) // 6  # the last one whose bits do
        fragment = encoded[start:end]
        if len(fragment) >= MIN_FRAGMENT:
            yield fragment


def withhold(tree: Path, rels: Iterable[str], secrets: Secrets) -> dict[str, Encoding]:
    """Remove from `tree` (a snapshot being built, the server's alone) each file of `rels` that holds a
    known value; what was removed, and how it held it (files/workspaces.py records it for the result)."""
    held: dict[str, Encoding] = {}
    if not len(secrets):
        return held
    for rel in rels:
        parts = safe.split(rel)
        with safe.directory(tree, parts[:-1]) as folder:
            with os.fdopen(safe.open_regular(folder, parts[-1], rel), "rb") as file:
                found = secrets.held(file)
            if found is not None:
                os.unlink(parts[-1], dir_fd=folder)
                held[rel] = found
    return held
