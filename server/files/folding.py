"""Names as case-insensitive filesystems compare them, so a rule about a name holds in every spelling.

APFS and HFS+ (macOS), NTFS (Windows) and their shares fold letter case; HFS+ also ignores some code
points, and NTFS drops trailing dots and spaces and answers to 8.3 short names. A name a rule matches on
one of them must match in every spelling that opens the same file there (git's `verify_dotfile` does the
same for `.git`). review.py (VCS metadata, artefacts) and autorun.py (files that run code) use it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

# Code points HFS+ ignores in names (git's is_hfs_dotgit): `.g\u200cit` is `.git` there.
_IGNORABLE = dict.fromkeys(
    [0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)


def folded(name: str) -> str:
    """A name as case-insensitive, HFS+ and NTFS filesystems compare it (trailing dots and spaces dropped)."""
    name = name.translate(_IGNORABLE).casefold().rstrip(" .")
    return ".git" if name == "git~1" else name  # NTFS's 8.3 short name of .git


def folded_parts(rel: str) -> list[str]:
    """Each component of a posix path, folded."""
    return [folded(part) for part in PurePosixPath(rel).parts]
