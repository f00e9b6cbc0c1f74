"""Team configuration as pydantic models: agents, coordination, sandbox, the team, and their limits.

A provider's own key variable goes only to that provider's official endpoint: a custom `base_url` must name
a variable of its own, and no agent may name another provider's key: a team file cannot send your key for
one provider to a server of its choosing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from conclave.config.clis import CLIS, CliFacts, login_source, split_cli_model
from conclave.config.hosts import parse_host_rule
from conclave.config.providers import PROVIDERS
from conclave.errors import MissingApiKey


def agent_kind(data: object) -> Literal["api", "cli"]:
    """The kind of agent a team file's entry (or a spec) is: `cli` when its provider's members are
    coding-agent CLIs, else `api`. The one place the kind is decided: a team's agents are parsed into the
    type of their kind (`TeamAgent`), and each place that treats a kind differently matches on that type."""
    model = data.get("model") if isinstance(data, dict) else getattr(data, "model", None)
    entry = PROVIDERS.get(str(model or "").partition("/")[0])
    return "cli" if entry is not None and entry.members_are_clis else "api"


EXPANDABLE = ("model", "base_url", "api_key_env", "model_path")  # agent keys where ${VAR} expands
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmg]?)b?\s*$", re.IGNORECASE)
MIN_MEMORY = 6 * 1024 * 1024  # Docker's own minimum for a container
MAX_AGENTS, MAX_ANSWERS = 16, 20
MAX_VERIFY_CHARS = 2000  # a check command is a command line, not a script
# Agents are lettered A to P (one per agent, at most MAX_AGENTS); an answer's label is its author's
# letter and revision, B2. The one pattern for both, everywhere a letter or label is read back.
LETTER = re.compile(r"[A-P]")
LABEL = re.compile(r"([A-P])([1-9][0-9]?)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(_Strict):
    """US dollars per million tokens; used to report cost when known."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)


MEMBER_TOKENS_FIX = "give the most tokens (in and out, over the whole job) this member may use, e.g. 300000"


class MemberBudgetSpec(_Strict):
    """One member's own limit beside the job's (coordination.max_tokens): once its usage reaches it, the
    member takes no more turns and the job goes on with the others (coordination/orchestrator.py)."""

    max_tokens: int = Field(description="the tokens (in and out) this member may use in one job")

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _positive_tokens(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**10:
            raise ValueError(
                f"budget.max_tokens {value!r} is not a whole number from 1 to 10^10: {MEMBER_TOKENS_FIX}"
            )
        return value


class AgentSpec(_Strict):
    """One team member: a `provider/model` string and how to call it."""

    model: Annotated[str, Field(description="provider/model, e.g. openai/gpt-5")]
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_required: bool = True  # false for local servers (Ollama, vLLM) that take any key
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    seed: int | None = None
    system_prompt: str | None = None
    max_tokens: Annotated[int, Field(ge=16, le=200_000)] = 4096
    tool_mode: Literal["native", "json"] = "native"
    # single: one call per turn ends with a workflow decision (a tool call, or JSON in `json` mode).
    # split: the answer is plain text from a short prompt, the decision a separate short choice, or a
    # score by the model's own log-probabilities where the backend can (local); with files, single.
    turn: Literal["single", "split"] = "single"
    stream: bool = True
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 4
    model_path: str | None = None
    price: Price | None = None
    budget: MemberBudgetSpec | None = None  # this member's own limit, beside the job's
    # A coding-agent CLI member kept only when the user is logged in to its CLI (the subscriptions preset).
    if_logged_in: bool = False

    @field_validator("model")
    @classmethod
    def _provider_model(cls, value: str) -> str:
        provider, _, name = value.partition("/")
        if provider not in PROVIDERS or not name:
            raise ValueError(
                f"model {value!r} must look like provider/model with provider one of "
                f"{', '.join(PROVIDERS)} (e.g. openai/gpt-5)"
            )
        return value

    @model_validator(mode="after")
    def _of_its_kind(self) -> AgentSpec:
        if type(self) is AgentSpec and agent_kind(self) == "cli":
            raise ValueError(f"model {self.model!r} is a coding-agent CLI member: build it as a CliAgentSpec")
        return self

    @model_validator(mode="after")
    def _key_goes_to_its_provider(self) -> AgentSpec:
        owner = PROVIDERS.key_owner(self.api_key_env or "")
        if owner is not None and (owner != self.provider or self.custom_endpoint):
            where = f"base_url {self.base_url!r}" if self.custom_endpoint else f"the {self.provider} API"
            raise ValueError(
                f"api_key_env {self.api_key_env!r} is {owner}'s own key and is sent only to "
                f"{PROVIDERS[owner].official_url}, never to {where}; give that endpoint a variable of its "
                "own (e.g. api_key_env: MY_PROXY_KEY, "
                "set to the key it should get)"
            )
        if self.custom_endpoint and self.api_key_env is None and self.api_key_required:
            raise ValueError(
                f"base_url {self.base_url!r} is not {self.provider}'s own endpoint, so the agent must "
                f"name the variable holding that endpoint's key with api_key_env "
                f"(e.g. api_key_env: MY_PROXY_KEY); "
                f"{', '.join(PROVIDERS[self.provider].key_variables) or 'a default key'} is never sent "
                "there. "
                "For a server that takes no key, set api_key_required: false"
            )
        return self

    @property
    def custom_endpoint(self) -> bool:
        """Whether `base_url` points anywhere but the provider's own API."""
        if not self.base_url:
            return False
        url = urlsplit(self.base_url)
        return url.scheme != "https" or (url.hostname or "").lower() != PROVIDERS[self.provider].official_host

    @property
    def endpoint_url(self) -> str | None:
        """Where this agent's requests go: its base_url, else its provider's official URL (never left to an
        SDK's environment variables); None for `local`, whose backend starts its own server."""
        return self.base_url or PROVIDERS[self.provider].official_url

    @property
    def provider(self) -> str:
        return self.model.partition("/")[0]

    @property
    def model_name(self) -> str:
        return self.model.partition("/")[2]

    def key_variables(self) -> tuple[str, ...]:
        """The environment variables that may hold this agent's key, in order of preference.

        None for a custom endpoint that names no variable (it takes no key): a provider's default key
        goes only to that provider's own endpoint.
        """
        if self.api_key_env:
            return (self.api_key_env,)
        return () if self.custom_endpoint else PROVIDERS[self.provider].key_variables

    def api_key(self, environ: Mapping[str, str]) -> str:
        """The key from the environment; raises MissingApiKey naming the variable to set."""
        variables = self.key_variables()
        if not variables:
            return "unused"
        for variable in variables:
            if environ.get(variable):
                return environ[variable]
        if not self.api_key_required:
            return "unused"
        raise MissingApiKey(variables[0], self.model)


class CliAgentSpec(AgentSpec):
    """A coding-agent CLI member (`cli/<name>[:model]`): the CLI runs in its container, logged in with the
    user's login or key (clis/logins.py)."""

    # a CLI member works a whole turn in one call
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 600.0

    @field_validator("model")
    @classmethod
    def _names_a_cli(cls, value: str) -> str:
        if split_cli_model(value.partition("/")[2])[0] not in CLIS:
            raise ValueError(
                f"model {value!r} names no coding-agent CLI: use cli/ with one of {', '.join(CLIS)}, "
                "optionally with a model (e.g. cli/claude-code:opus, cli/codex:gpt-5.5)"
            )
        return value

    @property
    def facts(self) -> CliFacts:
        """The CLI this member runs."""
        return CLIS[split_cli_model(self.model_name)[0]]

    @property
    def cli_model(self) -> str | None:
        """The model the CLI is asked for (`cli/codex:gpt-5.5`); None: the CLI's own default."""
        return split_cli_model(self.model_name)[1]

    def logged_in(self, environ: Mapping[str, str]) -> bool:
        """Whether the user is logged in to this CLI here: a login file, or one of its key variables."""
        return login_source(self.facts, environ) is not None

    def needs_login(self, environ: Mapping[str, str]) -> bool:
        """Whether this member still needs that login: its own endpoint or key variable needs none."""
        return not self.base_url and not self.api_key_env and not self.logged_in(environ)


# A team file's agent, parsed into the type of its kind (`agent_kind`).
TeamAgent = Annotated[
    Annotated[AgentSpec, Tag("api")] | Annotated[CliAgentSpec, Tag("cli")], Discriminator(agent_kind)
]


class CoordinationSpec(_Strict):
    """How the team converges."""

    max_answers_per_agent: Annotated[int, Field(ge=1, le=MAX_ANSWERS)] = 3
    consensus: Literal["all_voted", "majority"] = "all_voted"
    final: Literal["present", "reuse"] = "present"
    timeout_s: Annotated[float, Field(gt=0, le=24 * 3600)] = 900.0
    max_tool_steps: Annotated[int, Field(ge=0, le=200)] = 8
    max_failed_turns: Annotated[int, Field(ge=1, le=20)] = 3
    # Budgets (ask_team's max_cost_usd and max_tokens override them): once the job's usage reaches one,
    # no model call starts and the job ends with the best-supported answer so far (orchestrator.py).
    max_cost_usd: Annotated[float, Field(gt=0, le=10_000)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=10**10)] | None = None


class SandboxSpec(_Strict):
    """The Docker confinement of agents' commands (sandbox/container.py)."""

    image: str = "conclave-sandbox"
    # `bridge` gives agents' commands the network: the server must allow it (CONCLAVE_SANDBOX_NETWORK)
    network: Literal["none", "bridge"] = "none"
    memory: str = "1g"
    cpus: Annotated[float, Field(gt=0, le=64)] = 1.0
    pids: Annotated[int, Field(ge=16, le=65536)] = 256
    # Hosts coding-agent CLI members may reach besides their provider's (sandbox/allowlist.py), as
    # `host`, `host:port` (443 unless named) or `*.domain`; every other host stays refused.
    allow_hosts: Annotated[list[str], Field(max_length=64)] = []

    @field_validator("allow_hosts")
    @classmethod
    def _host_rules(cls, value: list[str]) -> list[str]:
        for host in value:
            parse_host_rule(host)  # its ValueError names the entry and the shape to write
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        size = memory_bytes(value)
        if size is None or size < MIN_MEMORY:
            raise ValueError(f"memory {value!r} is not a size of at least 6m: write e.g. 512m or 1g")
        return value.strip()


def memory_bytes(value: str) -> int | None:
    """A Docker memory size (`512m`, `1g`, `1.5gb`, `1048576`) in bytes; None when it is not one."""
    match = _MEMORY.match(value) if isinstance(value, str) else None
    units = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    return int(float(match.group(1)) * units[match.group(2).lower()]) if match else None


class Team(_Strict):
    """A named team of 1 to 16 agents."""

    name: str
    description: str = ""
    agents: Annotated[list[TeamAgent], Field(min_length=1, max_length=MAX_AGENTS)]
    coordination: CoordinationSpec = CoordinationSpec()
    sandbox: SandboxSpec | Literal["none"] = SandboxSpec()
    # A check run on each answer's files in a fresh sandbox (e.g. `python3 -m unittest -q`);
    # ask_team's `verify` overrides it. Needs context paths and Docker (coordination/verification.py).
    verify: Annotated[str, Field(min_length=1, max_length=MAX_VERIFY_CHARS)] | None = None
    # Paths (gitignore patterns, per context folder) a check puts back as they were at job start before it
    # runs, so an answer cannot pass by editing the tests; omitted: files/protect.py's defaults for Python
    # and JavaScript projects; [] protects nothing (but modules that shadow the standard library or the
    # runner's own imports are still put back).
    verify_protect: (
        Annotated[list[Annotated[str, Field(min_length=1, max_length=200)]], Field(max_length=200)] | None
    ) = None

    def unpriced(self) -> list[str]:
        """The agents (`provider/model`) without a price: a cost budget cannot be kept for them."""
        # Claude Code reports its own cost (clis/claude_code.py): it needs no price
        return [
            agent.model
            for agent in self.agents
            if agent.price is None and agent.model.partition(":")[0] != "cli/claude-code"
        ]

    def missing_keys(self, environ: Mapping[str, str]) -> list[str]:
        """The variables to set before this team can run (empty when all keys are there)."""
        missing: list[str] = []
        for agent in self.agents:
            try:
                agent.api_key(environ)
            except MissingApiKey as exc:
                if exc.variable not in missing:
                    missing.append(exc.variable)
        for cli in self.clis:
            if cli.needs_login(environ):
                facts = cli.facts
                missing.append(
                    f"a {facts.name} login (~/{facts.config_dir}/{facts.login_files[0]}) "
                    f"or {facts.key_variables[0]}"
                )
        return missing

    @property
    def clis(self) -> list[CliAgentSpec]:
        """The coding-agent CLI members, in the team's order."""
        return [agent for agent in self.agents if isinstance(agent, CliAgentSpec)]
