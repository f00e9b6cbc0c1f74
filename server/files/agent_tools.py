"""The work tools team agents call: files in their workspace, peers' snapshots, and `run_command`.

Every argument is parsed by its model in tool_args.py, and every path reaches its root (the agent's own
workspace, or a peer's latest snapshot, read-only) only through safe.py's no-follow, fd-relative walk:
an agent's background process may swap anything in its workspace at any time, so nothing here opens a
workspace path by name. Files are read only when regular and under the cap (checked with fstat first);
`search` has a time budget (the `regex` module's timeout, matching without the GIL) and a size cap.
A tool never raises to the model: a problem comes back as a tool result that says what to fix. Blocking
file work runs in an abandonable worker thread, so cancelling a job never waits for it. The workflow
calls (`new_answer`, `vote`) are in turns.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread
import regex

from conclave.backends.base import ToolSpec
from conclave.errors import ConclaveError, InputError
from conclave.files import safe
from conclave.files.disk_budget import AgentDisk, OverBudget
from conclave.files.peer_access import peer_readable
from conclave.files.tool_args import (
    DEFAULT_COMMAND_TIMEOUT_S,
    MAX_COMMAND_TIMEOUT_S,
    CommandArgs,
    EditArgs,
    ListArgs,
    ReadArgs,
    SearchArgs,
    WriteArgs,
    parse,
)
from conclave.files.trees import list_tree

MAX_READ_CHARS = 60_000
MAX_FILE_BYTES = 8 * 1024 * 1024  # read_file and edit_file refuse larger files by their size
MAX_WRITE_BYTES = 2_000_000
MAX_LIST = 400
MAX_MATCHES = 200
MAX_SEARCH_FILE = 4 * 1024 * 1024  # larger files are skipped by search (by fstat size)
MAX_SEARCH_BYTES = 64 * 1024 * 1024  # what one search reads in all
SEARCH_BUDGET_S = 5.0  # one search's time, the pattern's matching included

ToolHandler = Callable[[dict[str, Any]], Awaitable[str]]


class CommandSandbox(Protocol):
    """Where the agent's shell commands run (sandbox.Sandbox is one): `exec` runs one; its result may carry
    `workspace_bytes`, the workspace's size measured after the command."""

    async def exec(self, command: str, timeout_s: float, max_bytes: int | None = None) -> Any: ...


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
    sandbox: CommandSandbox | None = None  # None: no run_command tool
    owner: tuple[int, int] | None = None  # who owns files written for the sandbox user
    disk: AgentDisk | None = None  # the job's disk budget, as this agent sees it
    # With several context paths the workspace root holds one folder each, and only they reach the
    # diff: writes elsewhere are refused. Empty: anywhere in the workspace.
    folders: tuple[str, ...] = ()

    def specs(self) -> tuple[ToolSpec, ...]:
        peer = {"type": "string", "description": "read a peer's latest snapshot instead, by its letter"}
        specs = [
            ToolSpec(
                "list_files",
                "List files under a folder of your workspace (or a peer's snapshot).",
                _schema({"path": {**_PATH, "default": ""}, "peer": peer}, []),
            ),
            ToolSpec(
                "read_file",
                "Read a text file, optionally lines start_line..end_line (1-based).",
                _schema(
                    {
                        "path": _PATH,
                        "start_line": {"type": "integer", "minimum": 1},
                        "end_line": {"type": "integer", "minimum": 1},
                        "peer": peer,
                    },
                    ["path"],
                ),
            ),
            ToolSpec(
                "write_file",
                "Create or overwrite a file in your workspace with the given content.",
                _schema({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
            ),
            ToolSpec(
                "edit_file",
                "Replace an exact piece of text in a file of your workspace. old_text must "
                "match exactly once unless replace_all is true.",
                _schema(
                    {
                        "path": _PATH,
                        "old_text": {"type": "string"},
                        "new_text": {"type": "string"},
                        "replace_all": {"type": "boolean", "default": False},
                    },
                    ["path", "old_text", "new_text"],
                ),
            ),
            ToolSpec(
                "search",
                "Search files for a regular expression; returns path:line: text.",
                _schema(
                    {"pattern": {"type": "string"}, "path": {**_PATH, "default": ""}, "peer": peer},
                    ["pattern"],
                ),
            ),
        ]
        if self.sandbox is not None:
            specs.append(
                ToolSpec(
                    "run_command",
                    "Run a shell command in your sandbox: /workspace is your workspace, /peers/<letter> "
                    "holds "
                    "each peer's latest snapshot read-only, there is no network. Background processes end "
                    "with the command.",
                    _schema(
                        {
                            "command": {"type": "string"},
                            "timeout_s": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": MAX_COMMAND_TIMEOUT_S,
                                "default": DEFAULT_COMMAND_TIMEOUT_S,
                            },
                        },
                        ["command"],
                    ),
                )
            )
        return tuple(specs)

    def handlers(self) -> dict[str, ToolHandler]:
        sync: dict[str, tuple[type, Callable[[Any], str]]] = {
            "list_files": (ListArgs, self._list_files),
            "read_file": (ReadArgs, self._read_file),
            "write_file": (WriteArgs, self._write_file),
            "edit_file": (EditArgs, self._edit_file),
            "search": (SearchArgs, self._search),
        }
        handlers: dict[str, ToolHandler] = {
            name: _guarded(name, model, _threaded(fn)) for name, (model, fn) in sync.items()
        }
        if self.sandbox is not None:
            handlers["run_command"] = _guarded("run_command", CommandArgs, self._run_command)
        return handlers

    # Roots -----------------------------------------------------------------------------------------
    def _root(self, peer: str | None) -> Path:
        if peer in (None, ""):
            return self.workspace
        peers = self.peers()
        if peer not in peers:
            have = ", ".join(sorted(peers)) or "none yet (no peer has posted an answer)"
            raise ToolProblem(f"peer {peer!r} has no snapshot; peers with one: {have}")
        return peers[peer]

    # Tools -------------------------------------------------------------------------------------------
    def _list_files(self, args: ListArgs) -> str:
        shown = args.path or ""
        try:
            listing = list_tree(self._root(args.peer), shown, max_files=MAX_LIST)
        except (FileNotFoundError, NotADirectoryError):
            raise ToolProblem(f"{shown!r} is not a folder") from None
        lines = [f"{rel} ({entry.size} bytes)" for rel, entry in list(listing.files.items())[:MAX_LIST]]
        if listing.limit:
            lines.append(f"[the listing stopped: {listing.limit}; list a sub-folder]")
        elif listing.truncated:
            lines.append(f"[more than {MAX_LIST} files; list a sub-folder]")
        return "\n".join(lines) or "(no files)"

    def _read_file(self, args: ReadArgs) -> str:
        shown, root = args.path, self._root(args.peer)
        if args.peer and safe.lstat(root, shown) is not None and not peer_readable(root, shown):
            raise ToolProblem(
                f"peer {args.peer}'s {shown!r} is private (its mode lets only its author read it, as at "
                f"/peers/{args.peer}); read the files it shares"
            )
        data = _read(root, shown, "use list_files to see what exists")
        if b"\x00" in data[:8192]:
            raise ToolProblem(f"{shown!r} is a binary file ({len(data)} bytes); it cannot be shown as text")
        lines = data.decode("utf-8", errors="replace").splitlines()
        start = args.start_line or 1
        end = args.end_line or len(lines)
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

    def _write_file(self, args: WriteArgs) -> str:
        data = args.content.encode()
        if len(data) > MAX_WRITE_BYTES:
            raise ToolProblem(f"content is {len(data)} bytes; write files under {MAX_WRITE_BYTES} bytes")
        self._write(args.path, data)
        return f"wrote {len(data)} bytes to {args.path}"

    def _edit_file(self, args: EditArgs) -> str:
        shown = args.path
        text = _read(self.workspace, shown, "create it with write_file").decode(
            "utf-8", errors="surrogateescape"
        )
        count = text.count(args.old_text)
        if count == 0:
            raise ToolProblem(
                f"old_text was not found in {shown!r}; read the file and copy the exact text, "
                "whitespace included"
            )
        if count > 1 and not args.replace_all:
            raise ToolProblem(
                f"old_text appears {count} times in {shown!r}; include more surrounding lines "
                "so it is unique, or set replace_all to true"
            )
        self._write(
            shown, text.replace(args.old_text, args.new_text).encode("utf-8", errors="surrogateescape")
        )
        return f"replaced {count} occurrence{'s' if count > 1 else ''} in {shown}"

    def _write(self, rel: str, data: bytes) -> None:
        parts = safe.split(rel)
        if self.folders and (len(parts) < 2 or parts[0] not in self.folders):
            where = ", ".join(f"{name}/" for name in self.folders)
            raise ToolProblem(
                f"{rel!r} is outside the project folders; only files inside {where} become the result, so "
                f"write there (e.g. {self.folders[0]}/{parts[-1] if parts else 'notes.md'})"
            )
        if self.disk is not None:
            before = safe.lstat(self.workspace, rel)
            self.disk.check(before.st_size if before is not None else 0, len(data))
        written = safe.write_bytes(self.workspace, rel, data, owner=self.owner)
        if self.disk is not None:
            self.disk.wrote(written.old_size, written.new_size)

    def _search(self, args: SearchArgs) -> str:
        try:
            compiled = regex.compile(args.pattern)
        except regex.error as exc:
            raise ToolProblem(f"the pattern is not a valid regular expression: {exc}") from exc
        root, start = self._root(args.peer), args.path or ""
        try:
            listing = list_tree(root, start, max_files=20_000)
        except (FileNotFoundError, NotADirectoryError):
            raise ToolProblem(f"{start!r} is not a folder") from None
        prefix = "/".join(safe.split(start))
        deadline, budget = time.monotonic() + SEARCH_BUDGET_S, MAX_SEARCH_BYTES
        matches: list[str] = []
        large = 0
        for rel, entry in listing.files.items():
            if entry.size > MAX_SEARCH_FILE or entry.size > budget:
                large += 1
                continue
            path = f"{prefix}/{rel}" if prefix else rel
            if args.peer and not peer_readable(root, path):
                continue  # private to its author, as at /peers/<letter> (peer_access.py)
            try:
                data = safe.read_bytes(root, path, MAX_SEARCH_FILE)
                text = data.decode("utf-8")
            except (OSError, InputError, UnicodeDecodeError):
                continue  # binary, unreadable, swapped or grown: not searched
            budget -= len(data)
            for number, line in enumerate(text.splitlines(), 1):
                try:
                    hit = compiled.search(
                        line, concurrent=True, timeout=max(deadline - time.monotonic(), 0.001)
                    )
                except TimeoutError:
                    matches.append(
                        f"[search stopped after its {SEARCH_BUDGET_S:g} s budget: simplify the pattern "
                        "(nested repetition like (a+)+ is slow) or search a smaller folder]"
                    )
                    return "\n".join(matches)
                if hit:
                    matches.append(f"{rel}:{number}: {line[:300]}")
                    if len(matches) >= MAX_MATCHES:
                        return "\n".join(matches) + f"\n[stopped at {MAX_MATCHES} matches; narrow the search]"
        if large:
            matches.append(
                f"[{large} file(s) over {MAX_SEARCH_FILE:,} bytes not searched; use run_command grep]"
            )
        return "\n".join(matches) or "no matches"

    async def _run_command(self, args: CommandArgs) -> str:
        assert self.sandbox is not None
        if self.disk is None:
            result = await self.sandbox.exec(args.command, float(args.timeout_s))
        else:  # the command is stopped as soon as the workspace outgrows what the budget leaves it
            result = await self.sandbox.exec(args.command, float(args.timeout_s), max_bytes=self.disk.room())
        text = str(result.as_text())
        measured = getattr(result, "workspace_bytes", None)
        if self.disk is not None and isinstance(measured, int):
            self.disk.measured(measured)
            over = self.disk.budget.over()
            if over:
                text += f"\n[{over}]"
        return text


def _read(root: Path, rel: str, missing: str) -> bytes:
    try:
        return safe.read_bytes(root, rel, MAX_FILE_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        raise ToolProblem(f"{rel!r} is not a file; {missing}") from None
    except IsADirectoryError:
        raise ToolProblem(f"{rel!r} is a folder; use list_files to see what it holds") from None


def _threaded(fn: Callable[[Any], str]) -> Callable[[Any], Awaitable[str]]:
    async def run(args: Any) -> str:
        # abandon_on_cancel: a cancelled job (cancel_job, its deadline, SIGTERM) never waits for a file call
        return await anyio.to_thread.run_sync(fn, args, abandon_on_cancel=True)

    return run


def _guarded(name: str, model: type, fn: Callable[[Any], Awaitable[str]]) -> ToolHandler:
    """Arguments parsed by their model; problems become results the model can act on; bugs still raise."""

    async def run(arguments: dict[str, Any]) -> str:
        try:
            args = parse(model, name, arguments)
        except ValueError as exc:
            return tool_error(str(exc))
        try:
            return await fn(args)
        except (ToolProblem, ConclaveError, OverBudget) as exc:
            return tool_error(str(exc))
        except OSError as exc:
            return tool_error(f"{exc.strerror or exc} ({os.path.basename(str(exc.filename or ''))})")

    return run
