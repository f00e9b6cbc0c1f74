"""GitHub's Copilot service as Copilot CLI 1.0.102 uses it with the user's GitHub login: a token in
COPILOT_GITHUB_TOKEN (or GH_TOKEN, GITHUB_TOKEN), or the one its sign-in keeps in ~/.copilot/config.json
when it may not use a keychain (tests/fakes/login_files.py's `copilot_config`).

What the CLI asked a recording fake, in order (every call carries `Authorization: Bearer <the token>`;
there is no exchange for a short-lived Copilot token, copilot_internal/v2/token):
1. GET api.github.com/copilot_internal/user: the user's plan; its `endpoints.api` names the model host
   (`MODEL_HOST`, a personal plan's). `USER` answers it.
2. GET https://MODEL_HOST/models: the catalogue. The CLI keeps the models it knows, takes its default
   among them and speaks the wire a model's `supported_endpoints` offers; a model it does not know is
   "No supported model available". `MODELS` offers one, `claude-sonnet-4.6`, on Anthropic Messages.
3. POST https://MODEL_HOST/v1/messages, streamed: each turn. login_hosts.py hands it to the Anthropic
   fake as agent `AGENT`, so a CliWorker("anthropic", ...) answers it.
Its side calls (api.github.com copilot_internal/managed_settings and team_customizations, MODEL_HOST's
agents/swe/internal/memory/v0/enabled; the built-in GitHub MCP server at MODEL_HOST/mcp/readonly unless
`--disable-builtin-mcps`) get login_hosts.py's 404, which the CLI takes as "none" and goes on.
"""

from __future__ import annotations

MODEL_HOST = "api.individual.githubcopilot.com"
AGENT = "copilot"  # the Anthropic fake's agent name for MODEL_HOST's turns
LOGIN = "member-octocat"
MODEL = "claude-sonnet-4.6"


def _quota(name: str, unlimited: bool) -> dict[str, object]:
    return {
        "entitlement": 300,
        "overage_count": 0,
        "overage_permitted": False,
        "percent_remaining": 100.0,
        "quota_id": name,
        "quota_remaining": 300.0,
        "remaining": 300,
        "timestamp_utc": "2026-11-26T00:00:00.000Z",
        "unlimited": unlimited,
    }


USER: dict[str, object] = {
    "login": LOGIN,
    "access_type_sku": "plus_monthly_subscriber_quota",
    "analytics_tracking_id": "0123abcd",
    "assigned_date": "2026-01-01T00:00:00+00:00",
    "can_signup_for_limited": False,
    "chat_enabled": True,
    "copilot_plan": "individual",
    "endpoints": {
        "api": f"https://{MODEL_HOST}",
        "origin-tracker": "https://origin-tracker.individual.githubcopilot.com",
        "proxy": "https://proxy.individual.githubcopilot.com",
        "telemetry": "https://telemetry.individual.githubcopilot.com",
    },
    "organization_list": [],
    "organization_login_list": [],
    "quota_reset_date": "2026-12-01",
    "quota_snapshots": {
        name: _quota(name, name != "premium_interactions")
        for name in ("chat", "completions", "premium_interactions")
    },
}

MODELS: dict[str, object] = {
    "object": "list",
    "data": [
        {
            "id": MODEL,
            "name": "Claude Sonnet 4.6",
            "object": "model",
            "vendor": "Anthropic",
            "version": MODEL,
            "preview": False,
            "model_picker_enabled": True,
            "model_picker_category": "versatile",
            "billing": {"is_premium": True, "multiplier": 1},
            "capabilities": {
                "family": MODEL,
                "type": "chat",
                "object": "model_capabilities",
                "tokenizer": "o200k_base",
                # its output limit must cover the CLI's own request (32,000 tokens), or it refuses the turn
                "limits": {
                    "max_context_window_tokens": 200_000,
                    "max_output_tokens": 64_000,
                    "max_prompt_tokens": 168_000,
                },
                "supports": {"streaming": True, "tool_calls": True, "parallel_tool_calls": True},
            },
            "policy": {"state": "enabled", "terms": "Enabled"},
            "supported_endpoints": ["/v1/messages", "/chat/completions"],
        }
    ],
}

# (host, path) -> the JSON reply, for login_hosts.py
FIXED: dict[tuple[str, str], dict[str, object]] = {
    ("api.github.com", "/copilot_internal/user"): USER,
    (MODEL_HOST, "/models"): MODELS,
}
# MODEL_HOST's model path -> the Anthropic fake's route for AGENT, for login_hosts.py
MODEL_PATHS = {MODEL_HOST: ("/v1/messages", f"/anthropic/{AGENT}/v1/messages")}
