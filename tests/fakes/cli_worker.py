"""A scripted model for a coding-agent CLI working as a Conclave member (Claude Code over Anthropic
Messages, Codex over the OpenAI Responses API), reading each request the way a model would:

    a work run (the prompt ends "When you are done, reply with your complete answer ...")
        1. no tool result yet      -> one shell command through the CLI's own shell tool (`command`)
        2. after its result        -> the final message (`answer`)
    a decision run (the prompt asks for {"decision": ...})
        -> a vote for the first label shown with a passing check, else the first label shown, as the
           CLI's constrained output (Claude Code's StructuredOutput tool, Codex's JSON text)
    a presentation (the prompt ends "Write the final answer now.") -> the answer again
    anything else (a CLI's side calls: titles, summaries) -> a short text

What it saw is kept for the test: each decision prompt's labels in the order shown, and the tool
results the CLI sent back.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.responses_server import CUSTOM
from tests.fakes.script import RecordedRequest, Reply

WORK_MARK = "When you are done, reply with your complete answer"
DECISION_MARK = '{"decision": "vote" or "new_answer"'
PRESENT_MARK = "Write the final answer now."  # a winner's presentation (coordination/prompts.py)
_SHOWN = re.compile(r"=== ([A-P][0-9]+) \(([^)]*)\)( \[check: ([^\]]*)\])? ===")


@dataclass
class CliWorker:
    """One member's model: `wire` is "anthropic" (Claude Code, Copilot's own-key provider), "responses"
    (Codex) or "gemini" (Gemini CLI)."""

    wire: str
    command: str
    answer: str
    decisions: list[list[str]] = field(default_factory=list)  # the labels of each decision prompt, as shown
    checks: list[dict[str, str]] = field(default_factory=list)  # label -> check text, per decision
    tool_results: list[str] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)  # the tools the first work request offered

    def __call__(self, request: RecordedRequest) -> Reply:
        if (schema := _asked_schema(request.body, self.wire)) is not None:
            return Reply(text=json.dumps(_filled(schema)))  # a CLI's side call: Gemini CLI's model router
        prompt = _first_user_text(request.body, self.wire)
        if DECISION_MARK in prompt:
            return self._decide(request, prompt)
        if PRESENT_MARK in prompt:
            return Reply(text=self.answer)
        if WORK_MARK not in prompt:
            return Reply(text="Conclave member")
        results = _tool_results(request.body, self.wire)
        if not results:
            self.tool_names = _tool_names(request.body)
            return self._shell()
        self.tool_results += results
        return Reply(text=self.answer)

    def _shell(self) -> Reply:
        names = set(self.tool_names)
        if self.wire == "anthropic":
            tool = (
                "Bash"
                if "Bash" in names
                else next((n for n in self.tool_names if n.lower() in ("bash", "shell")), "bash")
            )
            return Reply(tool_calls=[(tool, {"command": self.command, "description": "fix the code"})])
        if self.wire == "gemini":
            return Reply(
                tool_calls=[("run_shell_command", {"command": self.command, "description": "fix the code"})]
            )
        if "exec_command" in names:
            return Reply(tool_calls=[("exec_command", {"cmd": self.command})])
        if "exec" in names:  # Codex's code mode (its default model): JavaScript that calls its shell
            script = f"const r = await tools.exec_command({{cmd: {json.dumps(self.command)}}});\ntext(r);"
            return Reply(tool_calls=[(CUSTOM + "exec", script)])
        return Reply(tool_calls=[("shell", {"command": ["bash", "-lc", self.command]})])

    def _decide(self, request: RecordedRequest, prompt: str) -> Reply:
        shown = _SHOWN.findall(prompt)
        labels = [label for label, _, _, _ in shown]
        checks = {label: check for label, _, _, check in shown}
        self.decisions.append(labels)
        self.checks.append(checks)
        passing = [label for label in labels if checks[label].startswith("passed")]
        choice = (passing or labels)[0]
        decision = {"decision": "vote", "answer": choice, "reason": "it passes its check"}
        if self.wire == "anthropic":
            tool = next((name for name in _tool_names(request.body) if "structured" in name.lower()), None)
            if tool is not None:
                return Reply(tool_calls=[(tool, decision)])
        return Reply(text=json.dumps(decision))


def answer_held(worker: CliWorker, until: threading.Event) -> Callable[[RecordedRequest], Reply]:
    """`worker`, with its work run's final message (its answer) held until `until` is set: a test orders
    when the member's answer lands without sleeping."""

    def respond(request: RecordedRequest) -> Reply:
        reply = worker(request)
        return dataclasses.replace(reply, gate=until) if reply.text == worker.answer else reply

    return respond


def _asked_schema(body: dict[str, Any], wire: str) -> dict[str, Any] | None:
    """The JSON schema a tool-less Gemini request asks its answer to follow (Gemini CLI's model router
    and its next-speaker check do): a model answers such a call with that JSON, never a tool call. Given
    anything else, the CLI retries with backoff and then falls back, minutes later."""
    if wire != "gemini" or body.get("tools"):
        return None
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    return schema if isinstance(schema, dict) else None


def _filled(schema: dict[str, Any]) -> Any:
    """A value of `schema`: each property filled, an enum's first choice."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "string")).lower()
    if kind == "object":
        return {name: _filled(sub) for name, sub in (schema.get("properties") or {}).items()}
    return {"array": [], "boolean": False, "integer": 0, "number": 0}.get(kind, "a short reason")


def _first_user_text(body: dict[str, Any], wire: str) -> str:
    """The prompt the CLI was given (its first user message; CLIs add context blocks of their own)."""
    texts: list[str] = []
    if wire == "gemini":
        for content in body.get("contents", []):
            if content.get("role") == "user":
                texts += [str(part.get("text", "")) for part in content.get("parts", []) if "text" in part]
    elif wire == "anthropic":
        for message in body.get("messages", []):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
            texts += [block.get("text", "") for block in blocks if block.get("type") == "text"]
    else:
        for item in body.get("input", []):
            if item.get("role") != "user":
                continue
            content = item.get("content")
            parts = content if isinstance(content, list) else [{"text": str(content)}]
            texts += [str(part.get("text", "")) for part in parts]
    return "\n".join(texts)


def _tool_results(body: dict[str, Any], wire: str) -> list[str]:
    if wire == "gemini":
        return [
            json.dumps(part["functionResponse"].get("response"))
            for content in body.get("contents", [])
            for part in content.get("parts", [])
            if "functionResponse" in part
        ]
    if wire == "anthropic":
        found = []
        for message in body.get("messages", []):
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_result":
                    inner = block.get("content")
                    found.append(json.dumps(inner) if not isinstance(inner, str) else inner)
        return found
    return [
        str(item.get("output"))
        for item in body.get("input", [])
        if item.get("type") in ("function_call_output", "custom_tool_call_output")
    ]


def _tool_names(body: dict[str, Any]) -> list[str]:
    """The tools a request offers: its `tools`, and Codex 0.169's `additional_tools` input items'."""
    names = []
    extra = [item for item in body.get("input") or [] if item.get("type") == "additional_tools"]
    for tool in [*(body.get("tools") or []), *(t for item in extra for t in item.get("tools") or [])]:
        names += [str(t.get("name") or "") for t in tool.get("tools") or []]  # a namespace's own
        names += [str(tool.get("name") or "")] + [
            str(d.get("name")) for d in tool.get("functionDeclarations", [])
        ]
    return [name for name in names if name]
