"""What one agent may read of another's answer: what the sandbox user could read of it at /peers/<letter>.

A snapshot's files are the server's (copied by it, modes kept: trees.py), and a peer's container runs
its commands as another user (uid 1000 under a root server: sandbox/container.py), so inside a
container the kernel lets a peer read a file only through its "other" read bit. The host-side tools
(`read_file` and `search` with `peer`, agent_tools.py) ask the same here, so a file its author kept
private (a login file copied with its 0600) reaches no peer and no peer's provider by either way.
Where the server runs as the sandbox user itself, the kernel would let a container read its own uid's
files: `Workspaces.publish` then leaves such files out of /peers, so the answer is the same on every
engine. A snapshot's folders are the server's own (their modes say
nothing of the author's wishes), so only the file's mode counts.
"""

from __future__ import annotations

import stat
from pathlib import Path

from conclave.files import safe


def peer_readable(root: Path, rel: str) -> bool:
    """Whether a peer may read the regular file `root/rel` (links never followed)."""
    info = safe.lstat(root, rel)
    return info is not None and stat.S_ISREG(info.st_mode) and bool(info.st_mode & stat.S_IROTH)
