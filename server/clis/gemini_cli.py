"""Gemini CLI: `gemini -p PROMPT -o stream-json`, JSONL events as the run goes (its messages, tool calls
and results: a run killed mid-way has printed something to be charged on), ending in a `result` event
with `stats.models.<m>.{input_tokens,output_tokens,cached}`; the answer is the assistant's messages.

Full-auto is `--approval-mode yolo` with `--skip-trust` (headless runs in an untrusted folder abort, and
yolo falls back). It has no schema-constrained output: the decision is asked for as JSON in the prompt.
Its re-spawn of itself is off (GEMINI_CLI_NO_RELAUNCH). No cost in its output.

A work run (0.61) keeps its own system prompt and its file and shell tools; a policy file (`--policy`)
denies its web, agent, to-do, plan-mode, topic and skill tools by name, which takes their definitions
out of every request. A decision run has our system prompt in place of its own (`GEMINI_SYSTEM_MD`, a
variable set for that run alone through `env`) and only its `read_file` tool: its policy file denies
every other tool; a presentation is as brief. (`tools.core` would do it only in the settings every
run reads: a system settings file under HOME is refused as not root's.) Without a model named
(`cli/gemini:MODEL`) it still makes its model router's call first.
"""

from __future__ import annotations

import json
from typing import Any

from conclave.backends.base import Usage
from conclave.clis.cli_adapter import SYSTEM_FILE, CliOutput, Login, json_lines, last_json_object
from conclave.config.clis import CLIS
from conclave.sandbox.member import HOME
from conclave.sandbox.provider_wire import Wire

API_URL = "https://generativelanguage.googleapis.com"
WORK_POLICY = ".gemini/work-policy.toml"  # under HOME, like the decision's: the tools each run is denied
DECISION_POLICY = ".gemini/decision-policy.toml"
NOT_TO_WORK = (
    "web_fetch",
    "google_web_search",
    "write_todos",
    "invoke_agent",
    "enter_plan_mode",
    "update_topic",
    "activate_skill",
)
# every other tool of 0.61 but read_file (a tool a later version adds would stay: the version is pinned)
NOT_TO_DECIDE = (
    *NOT_TO_WORK,
    "list_directory",
    "grep_search",
    "glob",
    "replace",
    "write_file",
    "run_shell_command",
    "list_background_processes",
    "read_background_output",
)


class Gemini:
    facts = CLIS["gemini"]
    native_schema = False
    presents = True

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        argv = ["gemini", "-p", prompt, "--approval-mode", "yolo", "--skip-trust", "-o", "stream-json"]
        argv += ["-m", model] if model else []
        if not brief:
            return [*argv, "--policy", f"{HOME}/{WORK_POLICY}"]
        return ["env", f"GEMINI_SYSTEM_MD={SYSTEM_FILE}", *argv, "--policy", f"{HOME}/{DECISION_POLICY}"]

    def wire(self, login: Login) -> Wire:
        return "gemini"

    def provider_url(self, login: Login) -> str | None:
        return (login.base_url or API_URL) if login.key else None

    def environment(self, login: Login, model: str | None) -> dict[str, str]:
        env = {"GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_CLI_HOME": HOME}
        if login.key:
            env["GEMINI_API_KEY"] = login.key
        url = login.bridge or login.base_url
        if url:
            env["GOOGLE_GEMINI_BASE_URL"] = url
        return env

    def home_files(self, login: Login, model: str | None) -> dict[str, bytes]:
        auth = "gemini-api-key" if login.key else "oauth-personal"
        settings = {
            "security": {"auth": {"selectedType": auth}},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"disableAutoUpdate": True},
        }
        return {
            **login.files,
            ".gemini/settings.json": json.dumps(settings).encode(),
            WORK_POLICY: _denying(NOT_TO_WORK),
            DECISION_POLICY: _denying(NOT_TO_DECIDE),
        }

    def parse(self, stdout: str) -> CliOutput:
        events = list(json_lines(stdout))
        result = next((event for event in reversed(events) if event.get("type") == "result"), None)
        if result is None:  # `-o json`'s one object (its answer in `response`)
            return _parse_object(stdout)
        text = "".join(
            str(event.get("content") or "")
            for event in events
            if event.get("type") == "message" and event.get("role") == "assistant"
        )
        usage = Usage()
        for model in ((result.get("stats") or {}).get("models") or {}).values():
            used = model or {}
            usage = usage + Usage(
                int(used.get("input_tokens") or 0),
                int(used.get("output_tokens") or 0),
                int(used.get("cached") or 0),
            )
        error = result.get("error") if result.get("status") != "success" else None
        if error is None and not text and result.get("status") != "success":
            error = f"Gemini CLI's run ended {result.get('status')!r}"
        return CliOutput(text, usage, None, None, str(error) if error and not text else None)


def _denying(tools: tuple[str, ...]) -> bytes:
    """A policy file (TOML) that denies each of `tools` by name."""
    rule = '[[rule]]\ntoolName = "{}"\ndecision = "deny"\npriority = 100\n'
    return "\n".join(rule.format(tool) for tool in tools).encode()


def _parse_object(stdout: str) -> CliOutput:
    data = last_json_object(stdout)
    if data is None or "response" not in data:
        return CliOutput("", error=f"Gemini CLI printed no response: {stdout[-500:]!r}")
    usage = Usage()
    for model in ((data.get("stats") or {}).get("models") or {}).values():
        tokens = (model or {}).get("tokens") or {}
        usage = usage + Usage(
            int(tokens.get("prompt") or tokens.get("input") or 0),
            int(tokens.get("candidates") or 0) + int(tokens.get("thoughts") or 0),
            int(tokens.get("cached") or 0),
        )
    error = data.get("error")
    text = str(data.get("response") or "")
    return CliOutput(text, usage, None, None, str(error) if error and not text else None)
