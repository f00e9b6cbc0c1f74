"""The one table of model providers: one `Provider` entry each, holding every fact the rest of Conclave
reads about it (its backend, its key variables, its official endpoint, what its backend can do).

    provider = PROVIDERS["openai"]
    provider.backend                      # "openai:OpenAIBackend", imported only when a team uses it
    provider.key_variables                # ("OPENAI_API_KEY",): where its key is read, and sent only to
    provider.official_url                 # https://api.openai.com/v1

The backend is named by its module under conclave.backends and its class, never imported here, so
`import conclave` (and a team file's validation) needs no provider SDK (as simonw/llm's model plugins
are registered by name and loaded on use). Adding a provider: its module `server/backends/<name>.py`
plus one entry in `_ENTRIES` (docs/ARCHITECTURE.md, "Adding a tool or a provider").

A `Gateway` is a service reached through a provider's API with a key and address of its own (OpenRouter,
Ollama, vLLM): it has no backend, only a preset team in configs/ and the variables that preset reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Provider:
    """One provider, the `provider` of a team member's `provider/model`."""

    name: str
    # "module:Class" under conclave.backends; "" for `cli`, whose members are coding-agent CLIs (clis/)
    backend: str
    # Where its key is read, in order of preference; each goes only to `official_url` (config/models.py).
    key_variables: tuple[str, ...] = ()
    # Given to its SDK explicitly: with no base_url an SDK would read OPENAI_BASE_URL and the like from the
    # environment, which a repository's client config may set. None: it has no hosted endpoint.
    official_url: str | None = None
    # The rank of its own shipped team (configs/<name>.yaml) when a caller names none; None: never chosen.
    default_team_rank: int | None = None
    # Its backend is also a Scorer (backends/base.py): a split turn votes by its log-probabilities.
    scores: bool = False
    # Its backend module has `check_ready(model_name, model_path)`, run at admission: what must be
    # installed before a job starts (a hosted provider needs only its key, which the team checks).
    checks_ready: bool = False
    # Built once before any job (backends `preload`): its SDK's imports and client set-up cost a first job
    # seconds. Not `local`, whose backend starts a llama.cpp server.
    preloaded: bool = False
    # Its backend takes the job's pool of local model servers (backends/llama_server.py `LocalServers`).
    takes_local_servers: bool = False
    # Its members are coding-agent CLIs (`cli/claude-code`), not models called through a backend: the
    # one fact that decides the kind of agent (config/models.py `agent_kind`).
    members_are_clis: bool = False

    @property
    def official_host(self) -> str:
        """The host of `official_url` ("" when it has none): a base_url elsewhere is a custom endpoint."""
        return (urlsplit(self.official_url).hostname or "") if self.official_url else ""

    @property
    def backend_module(self) -> str:
        return f"conclave.backends.{self.backend.partition(':')[0]}"

    @property
    def backend_class(self) -> str:
        return self.backend.partition(":")[2]


@dataclass(frozen=True)
class Gateway:
    """A service spoken to through `speaks`'s API at an address of its own: its preset (configs/<name>.yaml)
    reads `variables`, which the installers forward to the server."""

    name: str
    speaks: str
    variables: tuple[str, ...]


_ENTRIES = (
    Provider(
        "openai",
        "openai:OpenAIBackend",
        ("OPENAI_API_KEY",),
        "https://api.openai.com/v1",
        default_team_rank=2,
        preloaded=True,
    ),
    Provider(
        "anthropic",
        "anthropic:AnthropicBackend",
        ("ANTHROPIC_API_KEY",),
        "https://api.anthropic.com",
        default_team_rank=1,
        preloaded=True,
    ),
    Provider(
        "gemini",
        "gemini:GeminiBackend",
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        "https://generativelanguage.googleapis.com/",
        default_team_rank=3,
        preloaded=True,
    ),
    Provider("local", "local:LocalBackend", scores=True, checks_ready=True, takes_local_servers=True),
    # A coding-agent CLI member logs in with its own login or key (config/clis.py): no backend, no key here.
    Provider("cli", "", members_are_clis=True),
)
_GATEWAYS = (
    Gateway("openrouter", "openai", ("OPENROUTER_API_KEY",)),
    Gateway("ollama", "openai", ("OLLAMA_API_KEY", "OLLAMA_BASE_URL", "OLLAMA_MODEL")),
    Gateway("vllm", "openai", ("VLLM_API_KEY", "VLLM_BASE_URL", "VLLM_MODEL")),
)


class Registry(Mapping[str, Provider]):
    """The providers by name, in their table's order, and the gateways beside them."""

    def __init__(self, entries: tuple[Provider, ...], gateways: tuple[Gateway, ...]) -> None:
        self._entries = {entry.name: entry for entry in entries}
        if len(self._entries) != len(entries):
            raise ValueError(f"two providers share a name in {[entry.name for entry in entries]}")
        self.gateways = gateways

    def __getitem__(self, name: str) -> Provider:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def with_backends(self) -> tuple[Provider, ...]:
        """The providers a team member reaches through a backend (all but `cli`)."""
        return tuple(entry for entry in self._entries.values() if entry.backend)

    def key_owner(self, variable: str) -> str | None:
        """The provider whose own key `variable` is, or None: its key goes only to that provider's API."""
        return next((e.name for e in self._entries.values() if variable in e.key_variables), None)

    def default_teams(self) -> tuple[str, ...]:
        """The providers' own shipped teams, in the order a default team is chosen."""
        ranked = [e for e in self._entries.values() if e.default_team_rank is not None]
        return tuple(e.name for e in sorted(ranked, key=lambda e: e.default_team_rank or 0))

    def forwarded_variables(self) -> tuple[str, ...]:
        """Every variable a shipped team reads: each provider's keys, then each gateway's variables."""
        keys = [variable for entry in self._entries.values() for variable in entry.key_variables]
        return (*keys, *(variable for gateway in self.gateways for variable in gateway.variables))


PROVIDERS = Registry(_ENTRIES, _GATEWAYS)
