"""Gemini CLI: `gemini -p PROMPT -o json`, one object with `response` and `stats.models.<m>.tokens`.

Full-auto is `--approval-mode yolo` with `--skip-trust` (headless runs in an untrusted folder abort, and
yolo falls back). It has no schema-constrained output: the decision is asked for as JSON in the prompt.
Its re-spawn of itself is off (GEMINI_CLI_NO_RELAUNCH). No cost in its output.
"""

from __future__ import annotations

import json
from typing import Any

from conclave.backends.base import Usage
from conclave.config.clis import CLIS
from conclave.members.base import CliOutput, Login, last_json_object
from conclave.sandbox.member import HOME


class Gemini:
    facts = CLIS["gemini"]
    native_schema = False

    def command(self, prompt: str, model: str | None, schema: dict[str, Any] | None) -> list[str]:
        argv = ["gemini", "-p", prompt, "--approval-mode", "yolo", "--skip-trust", "-o", "json"]
        return argv + (["-m", model] if model else [])

    def environment(self, login: Login, model: str | None) -> dict[str, str]:
        env = {"GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_CLI_HOME": HOME}
        if login.key:
            env["GEMINI_API_KEY"] = login.key
        if login.base_url:
            env["GOOGLE_GEMINI_BASE_URL"] = login.base_url
        return env

    def home_files(self, login: Login, model: str | None) -> dict[str, bytes]:
        auth = "gemini-api-key" if login.key else "oauth-personal"
        settings = {
            "security": {"auth": {"selectedType": auth}},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"disableAutoUpdate": True},
        }
        return {**login.files, ".gemini/settings.json": json.dumps(settings).encode()}

    def parse(self, stdout: str) -> CliOutput:
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
