"""Claude Code: `claude -p PROMPT --output-format stream-json`, JSONL ending in one `result` object with
usage and total cost. With `--include-partial-messages` the stream also carries each API response's raw
`message_start` (its input usage) and `message_delta` (its output so far): a run killed mid-way is
charged what those reported (`streamed_usage`), as the API billed it.

Full-auto is `--permission-mode bypassPermissions`; as root it refuses unless IS_SANDBOX=1 (set: the
container is the sandbox). The decision uses `--json-schema`, read back from `structured_output`.

Every run leaves out what cannot work in its container or is not asked for: slash commands and skills
(`--disable-slash-commands`), MCP servers (`--strict-mcp-config`). A work run keeps Claude Code's own
system prompt and its file and shell tools (`--tools`: no web, agent, notebook or to-do tools, whose
definitions are most of a request's 12k tokens). A decision run has our short system prompt in place of
Claude Code's (`--system-prompt-file`) and no tools (`--tools ""`; its Read tool alone is 500 tokens, a
third of the decision: the answers' diffs are in the prompt): about 1k tokens where a whole run's request
sent 12k (2.1.330; bench/results/cli-decisions.json). A presentation is as brief, without the schema.
With a key login a brief run is also `--bare`, which drops the environment section (cwd, platform, model,
date: about 1 kB) and the deferred-tools placeholder; bare mode reads no OAuth login, so a plan's keeps
them (bench/results/cli-decision-shares.json).
"""

from __future__ import annotations

import json
from typing import Any

from conclave.backends.base import Usage
from conclave.clis.cli_adapter import SYSTEM_FILE, CliOutput, Login, json_lines, last_json_object
from conclave.config.clis import CLIS
from conclave.sandbox.member import HOME
from conclave.sandbox.provider_wire import Wire

CONFIG = ".claude"  # under HOME; CLAUDE_CONFIG_DIR points here
API_URL = "https://api.anthropic.com"
OAUTH_VARIABLE = "CLAUDE_CODE_OAUTH_TOKEN"  # a Claude plan's token: a plan login, not a key
WORK_TOOLS = "Bash,Read,Edit,Write,Glob,Grep"
DECISION_TOOLS = ""  # none (its structured output is a tool of its own, which `--tools` leaves in)


class ClaudeCode:
    facts = CLIS["claude-code"]
    native_schema = True
    presents = True

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        argv = [
            "claude",
            "-p",
            prompt,
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--permission-mode",
            "bypassPermissions",
            "--no-session-persistence",
            "--disable-slash-commands",
            "--strict-mcp-config",
        ]
        if model:
            argv += ["--model", model]
        if not brief:
            return [*argv, "--tools", WORK_TOOLS]
        argv += ["--tools", DECISION_TOOLS, "--system-prompt-file", SYSTEM_FILE]
        if login.key and _key_variable(login) == "ANTHROPIC_API_KEY":
            argv.append("--bare")  # its environment section and deferred tools out; reads only the key
        return [*argv, "--json-schema", json.dumps(schema)] if schema is not None else argv

    def wire(self, login: Login) -> Wire:
        return "anthropic"

    def provider_url(self, login: Login) -> str | None:
        if not login.key or (login.variable == OAUTH_VARIABLE and not login.base_url):
            return None  # a plan's token for the official API; a custom endpoint's key is a key
        return login.base_url or API_URL

    def environment(self, login: Login, model: str | None) -> dict[str, str]:
        env = {
            "CLAUDE_CONFIG_DIR": f"{HOME}/{CONFIG}",
            "IS_SANDBOX": "1",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        if login.key:
            env[_key_variable(login)] = login.key
        url = login.bridge or login.base_url
        if url:
            env["ANTHROPIC_BASE_URL"] = url
        return env

    def home_files(self, login: Login, model: str | None) -> dict[str, bytes]:
        return dict(login.files)

    def parse(self, stdout: str) -> CliOutput:
        results = [event for event in json_lines(stdout) if event.get("type") == "result"]
        data = results[-1] if results else last_json_object(stdout)
        if data is None or ("result" not in data and "structured_output" not in data):
            return CliOutput("", error=f"Claude Code printed no result: {stdout[-500:]!r}")
        usage = data.get("usage") or {}
        read = int(usage.get("cache_read_input_tokens") or 0)
        fresh = int(usage.get("input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0)
        cost = data.get("total_cost_usd")
        structured = data.get("structured_output")
        error = str(data.get("result") or data.get("subtype")) if data.get("is_error") else None
        return CliOutput(
            text=str(data.get("result") or ""),
            usage=Usage(fresh + read, int(usage.get("output_tokens") or 0), read),
            cost_usd=float(cost) if isinstance(cost, int | float) else None,
            structured=structured if isinstance(structured, dict) else None,
            error=error,
        )

    def streamed_usage(self, stdout: str) -> Usage:
        """What the API responses in the stream reported: each `message_start`'s usage, plus its
        `message_delta`'s cumulative output tokens (the last one seen for that response)."""
        total, output = Usage(), dict[object, int]()
        last: dict[object, int] = {}  # the open response of each (sub)agent, by parent tool use
        for event in json_lines(stdout):
            raw = event.get("event") if event.get("type") == "stream_event" else None
            if not isinstance(raw, dict):
                continue
            parent = event.get("parent_tool_use_id")
            if raw.get("type") == "message_start":
                used = (raw.get("message") or {}).get("usage") or {}
                read = int(used.get("cache_read_input_tokens") or 0)
                fresh = int(used.get("input_tokens") or 0) + int(used.get("cache_creation_input_tokens") or 0)
                total = total + Usage(fresh + read, 0, read)
                last[parent] = len(output)
                output[len(output)] = int(used.get("output_tokens") or 0)
            elif raw.get("type") == "message_delta" and parent in last:
                output[last[parent]] = int((raw.get("usage") or {}).get("output_tokens") or 0)
        return total + Usage(0, sum(output.values()), 0)


def _key_variable(login: Login) -> str:
    """Where a key login's key goes: a custom endpoint's as the API key; the user's own variable keeps
    its name (bare mode, `--bare`, reads ANTHROPIC_API_KEY alone)."""
    return "ANTHROPIC_API_KEY" if login.base_url else (login.variable or "ANTHROPIC_API_KEY")
