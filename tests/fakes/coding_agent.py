"""A scripted model for a real coding-agent CLI (Claude Code, Codex, Copilot, Gemini CLI) that delegates
one task to Conclave.

The CLI runs its own agent loop against a fake provider; this responder plays the model, reading each
request the way a model would:

    0. conclave still starting  -> wait for it (Claude Code offers WaitForMcpServers, and neither the tools
                                   nor ToolSearch, when its first request goes out before the server is up)
    1. no tool result yet       -> search for the conclave tools
                                   (Claude Code: ToolSearch; Codex: tool_search),
                                   unless the request offers them already (Copilot: conclave-ask_team;
                                   Gemini CLI: mcp_conclave_ask_team)
    2. the tools are known      -> ask_team(task, team, wait_seconds=0): the job comes back queued
    3. a job that is not done   -> get_status(job_id, wait_seconds=45)
    4. a job that is done       -> a final message quoting the team's answer

Requests that offer neither a search tool nor the conclave tools (side calls: titles, summaries, Gemini
CLI's routing) get a small JSON object as text, which reads as an answer and as the routing score.
What the CLI sent back (the search results, the tool results as the model read them) is kept for
the test to check.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.script import RecordedRequest, Reply

FINAL_PREFIX = "The team's answer:"
_JOB = re.compile(r"cj-[0-9a-f]{12}")


@dataclass
class CodingAgent:
    """The responder for one CLI run; `wire` is "anthropic" (Claude Code, Copilot), "responses" (Codex) or
    "gemini" (Gemini CLI)."""

    wire: str
    task: str
    team: str
    searches: list[list[str]] = field(default_factory=list)  # tool names each search returned
    calls: list[str] = field(default_factory=list)  # the conclave tools called, in order
    results: list[str] = field(default_factory=list)  # each conclave tool result as the model read it

    first_step: list[str] | None = None  # the conclave tools the first step offered without a search
    waited: bool = False  # whether it asked Claude Code to wait for the conclave server once

    def __call__(self, request: RecordedRequest) -> Reply:
        offered = [name for name in _tool_names(request.body) if "conclave" in name]
        if not (offered or self._searchable(request.body)):
            if not self.waited and "WaitForMcpServers" in _tool_names(request.body):
                self.waited = True
                return Reply(tool_calls=[("WaitForMcpServers", {"servers": ["conclave"]})])
            return Reply(text=json.dumps({"complexity_reasoning": "one delegation", "complexity_score": 10}))
        if self.first_step is None:
            self.first_step = offered
        history = self._history(request.body)
        found = self._found_tools(history)
        if found is None and offered:
            found = {_bare(name): name for name in offered}
        outputs = [text for kind, text in history if kind == "result"]
        if found is None:
            return self._search()
        if not self.calls:
            return self._call(found, "ask_team", {"task": self.task, "team": self.team, "wait_seconds": 0})
        self.results.append(outputs[-1] if outputs else "")
        view = _job_view(self.results[-1])
        if view is None:
            return Reply(text=f"Conclave failed: {self.results[-1][:2000]}")
        if view.get("state") in ("queued", "running", "presenting"):
            return self._call(found, "get_status", {"job_id": view["job_id"], "wait_seconds": 45})
        return Reply(text=f"{FINAL_PREFIX} {(view.get('result') or {}).get('answer')}")

    # What the request offers and holds, per wire format ----------------------------------------------
    def _searchable(self, body: dict[str, Any]) -> bool:
        tools = body.get("tools") or []
        if self.wire == "anthropic":
            return any(tool.get("name") == "ToolSearch" for tool in tools)
        return any(tool.get("type") == "tool_search" for tool in tools)

    def _history(self, body: dict[str, Any]) -> list[tuple[str, Any]]:
        """("search", tool names) and ("result", text) entries, oldest first."""
        found: list[tuple[str, Any]] = []
        if self.wire == "gemini":
            return [
                ("result", "\n".join(_texts(part["functionResponse"].get("response"))))
                for content in body.get("contents", [])
                for part in content.get("parts", [])
                if "functionResponse" in part
            ]
        if self.wire == "anthropic":
            for message in body.get("messages", []):
                content = message.get("content")
                for block in content if isinstance(content, list) else []:
                    if block.get("type") != "tool_result":
                        continue
                    parts = block.get("content")
                    parts = parts if isinstance(parts, list) else [{"type": "text", "text": str(parts)}]
                    names = [part["tool_name"] for part in parts if part.get("type") == "tool_reference"]
                    if names:
                        found.append(("search", names))
                    else:
                        found.append(("result", "\n".join(part.get("text", "") for part in parts)))
            return found
        for item in body.get("input", []):
            if item.get("type") == "tool_search_output":
                names = [
                    f"{tool['name']}/{inner['name']}"
                    for tool in item.get("tools", [])
                    for inner in tool.get("tools", [])
                ]
                found.append(("search", names))
            elif item.get("type") == "function_call_output":
                output = item.get("output")
                texts = (
                    [part.get("text", "") for part in output] if isinstance(output, list) else [str(output)]
                )
                found.append(("result", "\n".join(texts)))
        return found

    def _found_tools(self, history: list[tuple[str, Any]]) -> dict[str, str] | None:
        """The conclave tools the searches returned, by bare name; None before any search."""
        searches = [names for kind, names in history if kind == "search"]
        if not searches:
            return None
        if len(self.searches) < len(searches):
            self.searches = searches
        names = [name for found in searches for name in found]
        return {_bare(name): name for name in names if "conclave" in name}

    def _search(self) -> Reply:
        if self.wire == "anthropic":
            return Reply(tool_calls=[("ToolSearch", {"query": "+conclave ask team", "max_results": 5})])
        return Reply(tool_calls=[("tool_search", {"query": "conclave ask team", "limit": 8})])

    def _call(self, found: dict[str, str], tool: str, arguments: dict[str, Any]) -> Reply:
        if tool not in found:
            return Reply(text=f"Conclave's {tool} was not found; the search returned {self.searches}")
        self.calls.append(tool)
        return Reply(tool_calls=[(found[tool], arguments)])


def _tool_names(body: dict[str, Any]) -> list[str]:
    """The names of the tools a request offers, in every wire format."""
    names = []
    for tool in body.get("tools") or []:
        names += [str(tool.get("name", ""))] + [
            str(d.get("name")) for d in tool.get("functionDeclarations", [])
        ]
    return [name for name in names if name]


def _texts(value: Any) -> list[str]:
    """Every string in a Gemini function response, and any JobView-like object in it as JSON."""
    if isinstance(value, dict):
        own = [json.dumps(value)] if "job_id" in value else []
        return own + [text for item in value.values() for text in _texts(item)]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    return [value] if isinstance(value, str) else []


def _bare(name: str) -> str:
    """ask_team, from mcp__conclave__ask_team (Claude Code), mcp__conclave/ask_team (Codex),
    conclave-ask_team (Copilot) or mcp_conclave_ask_team (Gemini CLI)."""
    bare = re.split(r"__|/|-", name)[-1]
    return bare.removeprefix("mcp_conclave_")


_TEXT_VIEW = re.compile(r"Job (cj-[0-9a-f]{12}) \([^)]*\): (\w+) - ")


def _job_view(text: str) -> dict[str, Any] | None:
    """The JobView in a tool result: its JSON (Claude Code, Codex and Copilot hand the model the
    structured result; Codex puts its own `Wall time` lines before it), else its text form (Gemini CLI
    hands over the text block)."""
    seen = _TEXT_VIEW.search(text)
    if seen and '{"job_id"' not in text:
        answer = (
            text.split("\nFinal answer:\n", 1)[1].split("\n\nNext: ", 1)[0]
            if "\nFinal answer:\n" in text
            else None
        )
        return {"job_id": seen.group(1), "state": seen.group(2), "result": {"answer": answer}}
    start = text.find('{"')
    while start >= 0:
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            value = None
        if isinstance(value, dict) and _JOB.fullmatch(str(value.get("job_id"))):
            return value
        start = text.find('{"', start + 1)
    return None
