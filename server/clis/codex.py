"""Codex: `codex exec --json PROMPT`, a JSONL stream; the final message is the last `agent_message`
item, usage the sum of `turn.completed` events. No cost in its output.

Full-auto is `--dangerously-bypass-approvals-and-sandbox` (its own bwrap sandbox cannot work inside an
unprivileged container). Its Responses WebSocket transport ignores HTTPS_PROXY, so the provider is one
of ours with `supports_websockets = false`. The decision uses `--output-schema FILE` (strict: every
property required, no others).

Every run turns off what cannot work in its container or is not asked for (`-c` keys and `--disable`
features of 0.169): web search, apps, plugins, the browser, computer use, image generation, goals,
sub-agents, tool suggestions and the bundled skills' list. A work run keeps Codex's own instructions and
its shell and patch tools. A decision run also swaps its instructions for our short system prompt
(`model_instructions_file`), drops the permissions, environment and collaboration-mode sections, the
shell and `request_user_input` (`tools.experimental_request_user_input.enabled`). A presentation is as
brief, without the schema.

Codex's own default model (`gpt-6.1-sol` in 0.169) and the others its built-in catalog marks
`tool_mode: code_mode_only` get their tools as an `additional_tools` namespace: the JavaScript `exec`
orchestrator, and the sub-agent tools with their instructions (`multi_agent_version`), whatever the
features say (about 18k bytes of a 23k decision request); each model of that catalog also gets
`apply_patch`. A brief run on one of them reads a catalog of our own (`model_catalog_json`) whose one
entry is that model with none of these: no tools at all, and our instructions alone (about 2 kB a
request where a work run's first sent 29-50 kB; bench/results/cli-decision-shares.json). A model outside
that catalog keeps Codex's own description of it.
"""

from __future__ import annotations

import json
from typing import Any

from conclave.backends.base import Usage
from conclave.clis.cli_adapter import SCHEMA_FILE, SYSTEM_FILE, CliOutput, Login, json_lines
from conclave.config.clis import CLIS
from conclave.sandbox.member import HOME
from conclave.sandbox.provider_wire import Wire

CONFIG = ".codex"  # under HOME; CODEX_HOME points here
KEY_VARIABLE = "CONCLAVE_CODEX_KEY"  # the provider's env_key: the key under a name only Codex reads
PLAN_URL = "https://chatgpt.com/backend-api/codex"  # a ChatGPT plan's endpoint (auth.json logins)
API_URL = "https://api.openai.com/v1"
# features (`codex features list`) whose tools or instructions nothing in a member's container can use
NEVER = (
    "apps",
    "plugins",
    "browser_use",
    "computer_use",
    "image_generation",
    "goals",
    "multi_agent",
    "tool_suggest",
    "skill_search",
)
NOT_TO_DECIDE = ("shell_tool", "unified_exec", "view_image", "sleep_tool")
QUIET = ('web_search="disabled"', "include_apps_instructions=false", "skills.bundled.enabled=false")
DECIDE = (
    f'model_instructions_file="{SYSTEM_FILE}"',
    "include_permissions_instructions=false",
    "include_environment_context=false",
    "include_collaboration_mode_instructions=false",
    "tools.experimental_request_user_input.enabled=false",
)
DEFAULT_MODEL = "gpt-6.1-sol"  # 0.169's own when the config names none
# the models 0.169's built-in catalog lists: all but gpt-5.5 `tool_mode: code_mode_only`, and each with an
# apply_patch tool a brief run has no use for
CATALOG_MODELS = frozenset(
    {
        "gpt-5.5",
        "gpt-6-astra",
        "gpt-6.1-sol",
        "gpt-6.1-terra",
        "gpt-6-sol",
        "gpt-6-luna",
        "gpt-5.6-sol",
        "gpt-5.6-terra",
        "gpt-5.6-luna",
        "gpt-daybreak-blue-latest",
        "gpt-daybreak-red-latest",
        "codex-auto-review",
    }
)
BRIEF_CATALOG = f"{CONFIG}/brief-models.json"  # under HOME


def brief_catalog(slug: str) -> bytes:
    """A model catalog of one entry, `slug` without the code-mode tools and sub-agents: the fields 0.169
    requires, the instructions ours (the brief run's `model_instructions_file` replaces these anyway)."""
    entry = {
        "slug": slug,
        "display_name": slug,
        "base_instructions": "You are a careful reviewer.",
        "visibility": "list",
        "priority": 1,
        "supported_in_api": True,
        "shell_type": "shell_command",
        "default_reasoning_level": "low",
        "supported_reasoning_levels": [{"effort": "low", "description": "light reasoning"}],
        "context_window": 272_000,
        "support_verbosity": False,
        "truncation_policy": {"mode": "tokens", "limit": 10_000},
        "experimental_supported_tools": [],
    }
    return json.dumps({"models": [entry]}).encode()


class Codex:
    facts = CLIS["codex"]
    native_schema = True
    presents = True

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        argv = [
            "codex",
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--ephemeral",
            "-C",
            "/workspace",
        ]
        if model:
            argv += ["-m", model]
        features: tuple[str, ...] = NEVER
        config: tuple[str, ...] = QUIET
        if schema is not None:
            argv += ["--output-schema", SCHEMA_FILE]
        if brief:
            features, config = NEVER + NOT_TO_DECIDE, QUIET + DECIDE
            if (model or DEFAULT_MODEL) in CATALOG_MODELS:
                argv += [] if model else ["-m", DEFAULT_MODEL]  # the catalog's one entry, named
                config += (f'model_catalog_json="{HOME}/{BRIEF_CATALOG}"',)
        for feature in features:
            argv += ["--disable", feature]
        for setting in config:
            argv += ["-c", setting]
        return [*argv, prompt]

    def wire(self, login: Login) -> Wire:
        return "openai"  # the Responses API

    def provider_url(self, login: Login) -> str | None:
        return (login.base_url or API_URL) if login.key else None

    def environment(self, login: Login, model: str | None) -> dict[str, str]:
        env = {"CODEX_HOME": f"{HOME}/{CONFIG}"}
        if login.key:
            env[KEY_VARIABLE] = login.key
        return env

    def home_files(self, login: Login, model: str | None) -> dict[str, bytes]:
        if login.key:
            url = login.bridge or login.base_url or API_URL
            provider = f'env_key = "{KEY_VARIABLE}"\n'
        else:
            url, provider = PLAN_URL, "requires_openai_auth = true\n"
        config = (
            'model_provider = "conclave"\ncheck_for_update_on_startup = false\n'
            + (f"model = {json.dumps(model)}\n" if model else "")
            + "\n[analytics]\nenabled = false\n\n[model_providers.conclave]\n"
            f'name = "conclave"\nbase_url = {json.dumps(url)}\nwire_api = "responses"\n'
            f"supports_websockets = false\n{provider}"
        )
        files = {**login.files, f"{CONFIG}/config.toml": config.encode()}
        if (model or DEFAULT_MODEL) in CATALOG_MODELS:
            files[BRIEF_CATALOG] = brief_catalog(model or DEFAULT_MODEL)
        return files

    def parse(self, stdout: str) -> CliOutput:
        text, usage, error = "", Usage(), None
        for event in json_lines(stdout):
            kind = event.get("type")
            item = event.get("item") or {}
            if kind == "item.completed" and item.get("type") == "agent_message":
                text = str(item.get("text") or "")
            elif kind == "turn.completed":
                used = event.get("usage") or {}
                usage = usage + Usage(
                    int(used.get("input_tokens") or 0),
                    int(used.get("output_tokens") or 0),
                    int(used.get("cached_input_tokens") or 0),
                )
            elif kind in ("turn.failed", "error"):
                error = str((event.get("error") or {}).get("message") or event.get("message") or kind)
        structured = None
        if text.lstrip().startswith("{"):
            try:
                value = json.loads(text)
                structured = value if isinstance(value, dict) else None
            except ValueError:
                pass
        if not text and error is None:
            error = f"Codex printed no final message: {stdout[-500:]!r}"
        return CliOutput(text, usage, None, structured, error if not text else None)
