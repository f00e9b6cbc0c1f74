"""GitHub Copilot CLI: `copilot -p PROMPT --output-format json`, JSONL events; the final message is the
last `assistant.message`. Its stream carries no token counts: they come from `--usage-output-file`
(read back after the run, `modelMetrics.<m>.usage`). Cost is in premium requests, not dollars.

Full-auto is `--allow-all-tools`. Its built-in MCP servers (GitHub's, on the model host) are off: a
member works on its files, not on the user's repositories through their GitHub login. A custom endpoint
(`base_url`) is Copilot's own-key provider (COPILOT_PROVIDER_*, offline: no GitHub sign-in). No
schema-constrained output: JSON in the prompt.

Only the tools a run needs reach the model (`--available-tools`, 1.0.102): a work run its shell and
file tools, a brief run (a decision, a presentation) only `view` (to look at /peers). None gets the
repository's custom instructions (`--no-custom-instructions`). Its own system prompt cannot be
replaced in prompt mode (its SDK sessions' `systemMessage` is not reachable from `-p`): about 9 kB of a
decision request stay Copilot's, a third of a work run's first request (1.0.102,
bench/results/cli-decision-shares.json). So a Copilot member that wins does not present: its answer
stands as it is (`presents`).
"""

from __future__ import annotations

from typing import Any

from conclave.backends.base import Usage
from conclave.clis.cli_adapter import CliOutput, Login, json_lines, last_json_object
from conclave.config.clis import CLIS
from conclave.sandbox.member import HOME
from conclave.sandbox.provider_wire import Wire

USAGE_FILE = f"{HOME}/copilot-usage.json"
USAGE_MARK = "@@conclave-copilot-usage@@"  # the member's run prints the usage file after this line
WORK_TOOLS = ("bash", "read_bash", "stop_bash", "view", "create", "edit", "grep", "glob")
DECISION_TOOLS = ("view",)


class Copilot:
    facts = CLIS["copilot"]
    native_schema = False
    presents = False  # its own 8.7 kB system prompt stays in a brief run (see above)
    after = f'echo; echo "{USAGE_MARK}"; cat "{USAGE_FILE}" 2>/dev/null'  # run after the CLI, same exec

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        argv = [
            "copilot",
            "-p",
            prompt,
            "--allow-all-tools",
            "--output-format",
            "json",
            "--no-auto-update",
            "--disable-client-telemetry",
            "--disable-builtin-mcps",  # its GitHub MCP server would act on the user's GitHub with the token
            "--usage-output-file",
            USAGE_FILE,
            "-C",
            "/workspace",
            "--no-custom-instructions",
        ]
        argv += ["--model", model] if model else []
        return [*argv, "--available-tools", *(DECISION_TOOLS if brief else WORK_TOOLS)]

    def wire(self, login: Login) -> Wire:
        """Its own-key provider's API: Anthropic's for an endpoint that says so, else OpenAI's."""
        return "anthropic" if login.base_url and "anthropic" in login.base_url else "openai"

    def provider_url(self, login: Login) -> str | None:
        """Only its own-key provider (a base_url): a GitHub token is a plan login."""
        return login.base_url if login.key and login.base_url else None

    def environment(self, login: Login, model: str | None) -> dict[str, str]:
        env = {"COPILOT_HOME": f"{HOME}/.copilot", "COPILOT_AUTO_UPDATE": "false"}
        if login.base_url:
            env |= {
                "COPILOT_PROVIDER_BASE_URL": login.bridge or login.base_url,
                "COPILOT_OFFLINE": "true",
                "COPILOT_PROVIDER_TYPE": self.wire(login),
            }
            if login.key:
                env["COPILOT_PROVIDER_API_KEY"] = login.key
            if model:
                env["COPILOT_MODEL"] = model
        elif login.key:
            env["COPILOT_GITHUB_TOKEN"] = login.key
        return env

    def home_files(self, login: Login, model: str | None) -> dict[str, bytes]:
        return dict(login.files)

    def parse(self, stdout: str) -> CliOutput:
        stream, _, usage_text = stdout.partition(USAGE_MARK)
        text = ""
        for event in json_lines(stream):
            if event.get("type") == "assistant.message":
                content = (event.get("data") or {}).get("content")
                text = str(content) if content else text
        usage = Usage()
        metrics = (last_json_object(usage_text) or {}).get("modelMetrics") or {}
        for model in metrics.values():
            used = (model or {}).get("usage") or {}
            usage = usage + Usage(
                int(used.get("inputTokens") or 0),
                int(used.get("outputTokens") or 0),
                int(used.get("cacheReadTokens") or 0),
            )
        error = None if text else f"Copilot CLI printed no final message: {stream[-500:]!r}"
        return CliOutput(text, usage, None, None, error)
