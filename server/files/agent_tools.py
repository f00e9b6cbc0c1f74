"""The work tools team agents call: files in their workspace, peers' snapshots, and `run_command`.

Every path a model gives is resolved by `trees.resolve_inside` against its root (the agent's own
workspace, or a peer's latest snapshot, read-only). A tool never raises to the model: a problem comes
back as a tool result that says what to fix (tests/test_agent_tools.py). Blocking file work runs in a
worker thread. The workflow calls (`new_answer`, `vote`) are not here: turns.py owns them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread

from conclave.backends.base import ToolSpec
from conclave.errors import ConclaveError
from conclave.files.trees import list_tree, resolve_inside

MAX_READ_CHARS = 60_000
MAX_WRITE_BYTES = 2_000_000
MAX_LIST = 400
MAX_MATCHES = 200
DEFAULT_COMMAND_TIMEOUT_S = 60
MAX_COMMAND_TIMEOUT_S = 600

ToolHandler = Callable[[dict[str, Any]], Awaitable[str]]


class CommandRunner(Protocol):
    """Runs a shell command in the agent's sandbox (sandbox.Sandbox is one)."""

    async def exec(self, command: str, timeout_s: float) -> Any: ...


def tool_error(message: str) -> str:
    """What a model sees when its tool call could not be carried out."""
    return f"Error: {message}. Fix the call and try again, or end your turn with new_answer or vote."


class ToolProblem(Exception):
    """A call the model can fix; the message tells it how."""


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_PATH = {"type": "string", "description": "relative to the workspace root, e.g. 'src/app.py'"}


@dataclass
class AgentTools:
    """One agent's work tools for one job."""

    workspace: Path
    peers: Callable[[], Mapping[str, Path]]  # peer letter -> its latest snapshot (read-only)
    runner: CommandRunner | None = None
    owner: tuple[int, int] | None = None  # who owns files written for the sandbox user

    def specs(self) -> tuple[ToolSpec, ...]:
        peer = {"type": "string", "description": "read a peer's latest snapshot instead, by its letter"}
        specs = [
            ToolSpec("list_files", "List files under a folder of your workspace (or a peer's snapshot).",
                     _schema({"path": {**_PATH, "default": ""}, "peer": peer}, [])),
            ToolSpec("read_file", "Read a text file, optionally lines start_line..end_line (1-based).",
                     _schema({"path": _PATH, "start_line": {"type": "integer", "minimum": 1},
                              "end_line": {"type": "integer", "minimum": 1}, "peer": peer}, ["path"])),
            ToolSpec("write_file", "Create or overwrite a file in your workspace with the given content.",
                     _schema({"path": _PATH, "content": {"type": "string"}}, ["path", "content"])),
            ToolSpec("edit_file", "Replace an exact piece of text in a file of your workspace. old_text must "
                     "match exactly once unless replace_all is true.",
                     _schema({"path": _PATH, "old_text": {"type": "string"}, "new_text": {"type": "string"},
                              "replace_all": {"type": "boolean", "default": False}},
                             ["path", "old_text", "new_text"])),
            ToolSpec("search", "Search files for a regular expression; returns path:line: text.",
                     _schema({"pattern": {"type": "string"}, "path": {**_PATH, "default": ""}, "peer": peer},
                             ["pattern"])),
        ]
        if self.runner is not None:
            specs.append(ToolSpec(
                "run_command",
                "Run a shell command in your sandbox: /workspace is your workspace, /peers/<letter> holds "
                "each peer's latest snapshot read-only, there is no network.",
                _schema({"command": {"type": "string"},
                         "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_COMMAND_TIMEOUT_S,
                                       "default": DEFAULT_COMMAND_TIMEOUT_S}}, ["command"]),
            ))
        return tuple(specs)

    def handlers(self) -> dict[str, ToolHandler]:
        sync = {
            "list_files": self._list_files,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "edit_file": self._edit_file,
            "search": self._search,
        }
        handlers: dict[str, ToolHandler] = {name: _threaded(fn) for name, fn in sync.items()}
        if self.runner is not None:
            handlers["run_command"] = _guarded(self._run_command)
        return handlers

    # Roots -----------------------------------------------------------------------------------------
    def _root(self, args: Mapping[str, Any]) -> Path:
        peer = args.get("peer")
        if peer in (None, ""):
            return self.workspace
        peers = self.peers()
        if peer not in peers:
            have = ", ".join(sorted(peers)) or "none yet (no peer has posted an answer)"
            raise ToolProblem(f"peer {peer!r} has no snapshot; peers with one: {have}")
        return peers[peer]

    @staticmethod
    def _path(root: Path, args: Mapping[str, Any], key: str = "path") -> tuple[Path, str]:
        value = args.get(key, "")
        if not isinstance(value, str):
            raise ToolProblem(f"`{key}` must be a string path")
        return resolve_inside(root, value.strip() or "."), value

    # Tools -------------------------------------------------------------------------------------------
    def _list_files(self, args: dict[str, Any]) -> str:
        root = self._root(args)
        folder, shown = self._path(root, args)
        if not folder.is_dir():
            raise ToolProblem(f"{shown!r} is not a folder")
        listing = list_tree(folder, max_files=MAX_LIST)
        lines = [f"{rel} ({entry.size} bytes)" for rel, entry in list(listing.files.items())[:MAX_LIST]]
        if listing.truncated:
            lines.append(f"[more than {MAX_LIST} files; list a sub-folder]")
        return "\n".join(lines) or "(no files)"

    def _read_file(self, args: dict[str, Any]) -> str:
        path, shown = self._path(self._root(args), args)
        if not path.is_file():
            raise ToolProblem(f"{shown!r} is not a file; use list_files to see what exists")
        data = path.read_bytes()
        if b"\x00" in data[:8192]:
            raise ToolProblem(f"{shown!r} is a binary file ({len(data)} bytes); it cannot be shown as text")
        lines = data.decode("utf-8", errors="replace").splitlines()
        start = int(args.get("start_line") or 1)
        end = int(args.get("end_line") or len(lines))
        if start > max(len(lines), 1) or end < start:
            raise ToolProblem(f"lines {start}..{end} are outside {shown!r}, which has {len(lines)} lines")
        out, size = [], 0
        for number in range(start, min(end, len(lines)) + 1):
            line = f"{number:6}| {lines[number - 1]}"
            size += len(line) + 1
            if size > MAX_READ_CHARS:
                out.append(f"[cut at line {number - 1}; read on with start_line={number}]")
                break
            out.append(line)
        return "\n".join(out) or "(empty file)"

    def _write_file(self, args: dict[str, Any]) -> str:
        path, shown = self._path(self.workspace, args)
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolProblem("`content` must be a string")
        data = content.encode()
        if len(data) > MAX_WRITE_BYTES:
            raise ToolProblem(f"content is {len(data)} bytes; write files under {MAX_WRITE_BYTES} bytes")
        if path.is_dir():
            raise ToolProblem(f"{shown!r} is a folder")
        self._make_parents(path)
        path.write_bytes(data)
        self._own(path)
        return f"wrote {len(data)} bytes to {shown}"

    def _edit_file(self, args: dict[str, Any]) -> str:
        path, shown = self._path(self.workspace, args)
        old, new = args.get("old_text"), args.get("new_text")
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            raise ToolProblem("`old_text` (non-empty) and `new_text` must be strings")
        if not path.is_file():
            raise ToolProblem(f"{shown!r} is not a file; create it with write_file")
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        count = text.count(old)
        if count == 0:
            raise ToolProblem(
                f"old_text was not found in {shown!r}; read the file and copy the exact text, whitespace included"
            )
        if count > 1 and not args.get("replace_all"):
            raise ToolProblem(
                f"old_text appears {count} times in {shown!r}; include more surrounding lines so it is unique, "
                "or set replace_all to true"
            )
        path.write_text(text.replace(old, new), encoding="utf-8", errors="surrogateescape")
        return f"replaced {count} occurrence{'s' if count > 1 else ''} in {shown}"

    def _search(self, args: dict[str, Any]) -> str:
        pattern = args.get("pattern")
        try:
            regex = re.compile(pattern if isinstance(pattern, str) else "")
        except re.error as exc:
            raise ToolProblem(f"the pattern is not a valid regular expression: {exc}") from exc
        root = self._root(args)
        folder, _ = self._path(root, args)
        listing = list_tree(folder, max_files=20_000)
        matches: list[str] = []
        for rel in listing.files:
            try:
                text = (folder / rel).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # binary or unreadable files are not searched
            for number, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    matches.append(f"{rel}:{number}: {line[:300]}")
                    if len(matches) >= MAX_MATCHES:
                        return "\n".join(matches) + f"\n[stopped at {MAX_MATCHES} matches; narrow the search]"
        return "\n".join(matches) or "no matches"

    async def _run_command(self, args: dict[str, Any]) -> str:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolProblem("`command` must be a non-empty shell command")
        timeout = args.get("timeout_s", DEFAULT_COMMAND_TIMEOUT_S)
        if not isinstance(timeout, int | float) or not 1 <= timeout <= MAX_COMMAND_TIMEOUT_S:
            raise ToolProblem(f"timeout_s must be a number of seconds from 1 to {MAX_COMMAND_TIMEOUT_S}")
        assert self.runner is not None
        result = await self.runner.exec(command, float(timeout))
        return str(result.as_text())

    # Ownership ---------------------------------------------------------------------------------------
    def _make_parents(self, path: Path) -> None:
        missing = [p for p in reversed(path.parents) if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in missing:
            self._own(folder)

    def _own(self, path: Path) -> None:
        if self.owner is not None and os.geteuid() == 0:
            os.chown(path, *self.owner, follow_symlinks=False)


def _threaded(fn: Callable[[dict[str, Any]], str]) -> ToolHandler:
    async def run(args: dict[str, Any]) -> str:
        return await anyio.to_thread.run_sync(fn, args)

    return _guarded(run)


def _guarded(fn: ToolHandler) -> ToolHandler:
    """Problems become results the model can act on; bugs still raise."""

    async def run(args: dict[str, Any]) -> str:
        try:
            return await fn(args)
        except (ToolProblem, ConclaveError) as exc:
            return tool_error(str(exc))
        except OSError as exc:
            return tool_error(f"{exc.strerror or exc} ({os.path.basename(str(exc.filename or ''))})")

    return run
