"""Git-style unified diffs between two trees (a context path at job start and the winner's final copy).

The patch applies with `git apply` and `patch -p1`:
`diff --git` headers, `new file mode` / `deleted file mode` / `old mode`+`new mode`, `index` lines with
git blob ids, `---`/`+++`, `@@` hunks with 3 lines of context, `\\ No newline at end of file`, and git's
C-style quoting of unusual paths. Binary files (a NUL byte in the first 8,000 bytes, or not UTF-8) are
listed (`Binary files a/x and b/x differ`, with full blob ids), never inlined: `git apply` refuses such
entries unless the repository holds those blobs, so applying them goes through `apply.py`.
A text file that became binary is a way to hide a change from a reviewer, so it is flagged
(`became_binary`) and its new content follows the `Binary files` line as an escaped excerpt from the first
changed byte, on `#` lines that `git apply` skips.
A file that can run code or widen an agent's permissions on its own is marked (`autorun`, autorun.py),
so the summary names it whether or not apply runs. Renames show as a deletion plus an addition. Symlinks
in either tree are not part of the diff.

Which files count (git's rule): every file of the base, plus the final's files its own .gitignore files
do not ignore.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, computed_field

from conclave.files.autorun import Autorun, classify
from conclave.files.trees import IgnoreRules, Listing, list_tree, read_bytes

BINARY_SNIFF = 8000
NO_NEWLINE = "\\ No newline at end of file\n"
HUNK = re.compile(r"@@ -(\d+)")
_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r", 34: '\\"', 92: "\\\\"}


class FileChange(BaseModel):
    """One changed file in a patch's summary."""

    path: str
    status: Literal["added", "modified", "deleted", "binary"]
    change: Literal["added", "modified", "deleted"]  # what happened, binary or not
    added_lines: int = 0
    removed_lines: int = 0
    became_binary: bool = False  # was text at job start: its change cannot be reviewed as text
    autorun: Autorun | None = None  # it can run code or widen an agent's permissions on its own (autorun.py)


class Patch(BaseModel):
    """A unified diff and its summary; `skipped` lists final-tree entries left out (e.g. symlinks)."""

    text: str = ""
    files: list[FileChange] = []
    skipped: dict[str, str] = {}

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def added_lines(self) -> int:
        return sum(change.added_lines for change in self.files)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def removed_lines(self) -> int:
        return sum(change.removed_lines for change in self.files)

    @property
    def empty(self) -> bool:
        return not self.files


def final_listing(final: Path, tracked: Iterable[str]) -> Listing:
    """The final tree's files that count: tracked ones, and the rest unless its .gitignore ignores them."""
    return list_tree(final, rules=IgnoreRules(final), tracked=tracked)


def diff_trees(
    base: Path,
    final: Path,
    keep: Callable[[str], bool] | None = None,
    *,
    listed: Listing | None = None,
    known: Mapping[str, str] | None = None,
    final_known: Mapping[str, str] | None = None,
) -> Patch:
    """The git-style patch that turns `base` into `final` (blocking: call it from a worker thread);
    with `keep`, only the files of `final` it keeps (a deletion is always shown: base/ is no secret).
    `listed` is base's listing where the caller has just made it, and `known` base's files' sha256 as
    they were copied into it (the manifest's): a file of `final` with that digest and mode is
    unchanged without base's copy being read again (files/check_copy.py diffs once per check); and
    `final_known` the same for `final`'s files where `final` is immutable and its digests were recorded
    as it was made (a snapshot's, Workspaces.snapshot): a file with base's digest is not read at all."""
    old = listed if listed is not None else list_tree(base)
    new = final_listing(final, old.files)
    known, final_known = known or {}, final_known or {}
    chunks: list[str] = []
    files: list[FileChange] = []
    for rel in sorted(old.files.keys() | new.files.keys()):
        before, after = old.files.get(rel), new.files.get(rel)
        if after and keep is not None and not keep(rel):
            continue
        if before and after and (before.dev, before.ino) == (after.dev, after.ino):
            continue  # the same inode: a hard link from an immutable snapshot, unchanged
        a_mode = _git_mode(before.mode) if before else None
        b_mode = _git_mode(after.mode) if after else None
        digest = known.get(rel)
        if before and after and a_mode == b_mode and digest and final_known.get(rel) == digest:
            continue
        b = read_bytes(final, rel) if after else None
        if b is not None and a_mode == b_mode and digest and hashlib.sha256(b).hexdigest() == digest:
            continue
        a = read_bytes(base, rel) if before else None
        if a == b and a_mode == b_mode:
            continue
        text, change = file_diff(rel, a, b, a_mode, b_mode)
        chunks.append(text)
        files.append(change)
    return Patch(text="".join(chunks), files=files, skipped=new.skipped)


def file_diff(
    rel: str, a: bytes | None, b: bytes | None, a_mode: str | None, b_mode: str | None
) -> tuple[str, FileChange]:
    """One file's `diff --git` section and its summary line; None for a side means the file is absent."""
    change: Literal["added", "modified", "deleted"] = (
        "added" if a is None else "deleted" if b is None else "modified"
    )
    autorun = classify(rel, a, b)
    qa, qb = quote_path("a/", rel), quote_path("b/", rel)
    out = [f"diff --git {qa} {qb}\n"]
    if change == "added":
        out.append(f"new file mode {b_mode}\n")
    elif change == "deleted":
        out.append(f"deleted file mode {a_mode}\n")
    elif a_mode != b_mode:
        out += [f"old mode {a_mode}\n", f"new mode {b_mode}\n"]
    if a == b:  # a mode change only
        return "".join(out), FileChange(path=rel, status="modified", change=change, autorun=autorun)
    a_text, b_text = _text(a), _text(b)
    binary = a_text is None or b_text is None
    width = 40 if binary else 7
    same_mode = f" {a_mode}" if change == "modified" and a_mode == b_mode else ""
    out.append(f"index {_blob_id(a)[:width]}..{_blob_id(b)[:width]}{same_mode}\n")
    tab = "\t" if " " in rel else ""  # git marks names with spaces so the line's end is unambiguous
    src = "/dev/null" if a is None else qa + tab
    dst = "/dev/null" if b is None else qb + tab
    if binary:
        out.append(f"Binary files {src.rstrip()} and {dst.rstrip()} differ\n")
        became = change == "modified" and a_text is not None
        if became:
            out += hidden_change(a or b"", b or b"")
        return "".join(out), FileChange(
            path=rel, status="binary", change=change, became_binary=became, autorun=autorun
        )
    hunks, added, removed = _hunks(a_text or "", b_text or "")
    if hunks:
        out += [f"--- {src}\n", f"+++ {dst}\n", *hunks]
    return "".join(out), FileChange(
        path=rel, status=change, change=change, added_lines=added, removed_lines=removed, autorun=autorun
    )


EXCERPT = 400


def hidden_change(old: bytes, new: bytes) -> list[str]:
    """`#` lines saying why a text file now counts as binary.

    With the new bytes escaped from the first change.
    """
    first = next(
        (i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y), min(len(old), len(new))
    )
    start = new.rfind(b"\n", 0, first) + 1
    nul = new.find(b"\0", 0, BINARY_SNIFF)
    try:
        new.decode("utf-8")
        why = f"a NUL byte at offset {nul}"
    except UnicodeDecodeError as exc:
        why = f"a NUL byte at offset {nul}" if nul >= 0 else f"a byte that is not UTF-8 at offset {exc.start}"
    excerpt = new[start : start + EXCERPT]
    more = f" ({len(new) - start - EXCERPT:,} more bytes)" if len(new) - start > EXCERPT else ""
    return [
        f"# became binary ({why}): it was text at job start, so this change is hidden from a text diff\n",
        f"# new content from offset {start}, escaped{more}:\n",
        *(f"#   {line}\n" for line in _escaped(excerpt)),
    ]


def _escaped(data: bytes) -> list[str]:
    """`data` in printable ASCII, one string per line.

    \\xNN for other bytes, \\n kept visible at line ends.
    """
    lines, current = [], []
    for byte in data:
        if byte == 10:
            current.append("\\n")
            lines.append("".join(current))
            current = []
        elif 0x20 <= byte < 0x7F and byte != 0x5C:
            current.append(chr(byte))
        else:
            current.append({9: "\\t", 13: "\\r", 0x5C: "\\\\"}.get(byte, f"\\x{byte:02x}"))
    if current:
        lines.append("".join(current))
    return lines


def _hunks(a: str, b: str) -> tuple[list[str], int, int]:
    out: list[str] = []
    added = removed = 0
    old = _split(a)
    for line in difflib.unified_diff(old, _split(b), n=3, lineterm=""):
        if line.startswith(("---", "+++")) and not out:
            continue  # difflib's own file headers; ours are written by file_diff
        if line.startswith("@@"):
            start = int(HUNK.match(line).group(1))  # type: ignore[union-attr]
            context = _function_line(old, start - 1)
            out.append(f"{line} {context}\n" if context else line + "\n")
            continue
        added += line.startswith("+")
        removed += line.startswith("-")
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return out, added, removed


def _function_line(lines: list[str], before: int) -> str:
    """Git's default hunk context: the nearest earlier line starting with a letter, `_` or `$`."""
    for line in reversed(lines[:before]):
        if line[:1].isalpha() or line[:1] in ("_", "$"):
            return line.encode("utf-8")[:80].decode("utf-8", "ignore").rstrip()
    return ""


def _split(text: str) -> list[str]:
    """Lines split on '\\n' only, each keeping it (str.splitlines would also split on '\\r', '\\x0c'...)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _text(data: bytes | None) -> str | None:
    if data is None:
        return ""
    if b"\0" in data[:BINARY_SNIFF]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _blob_id(data: bytes | None) -> str:
    if data is None:
        return "0" * 40
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _git_mode(mode: int) -> str:
    return "100755" if mode & 0o111 else "100644"


def quote_path(prefix: str, rel: str) -> str:
    """`prefix + rel` as git writes it: C-quoted when it holds a quote, a backslash, control or non-ASCII."""
    raw = (prefix + rel).encode("utf-8", "surrogateescape")
    if not any(c < 0x20 or c >= 0x7F or c in (34, 92) for c in raw):
        return prefix + rel
    body = "".join(_ESCAPES.get(c) or (chr(c) if 0x20 <= c < 0x7F else f"\\{c:03o}") for c in raw)
    return f'"{body}"'
