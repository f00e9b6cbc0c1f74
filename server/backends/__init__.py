"""Model backends: one module per provider behind the `Backend` seam of `base.py`.

    backend = create_backend(Endpoint(provider="openai", model="gpt-5", api_key=key))
    completion = await retry.complete(backend, request, RetryPolicy())
    await backend.aclose()

`create_backend` imports a provider's module only when an endpoint asks for it, so a missing SDK
breaks only the teams that use it. Each backend maps its SDK's exceptions to `conclave.errors`;
`retry.py` holds the retry loop every backend shares.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from conclave.backends.base import Backend, Endpoint, ScoringBackend
from conclave.errors import ConfigError

if TYPE_CHECKING:
    from conclave.backends.llama_server import LocalServers

# provider -> (module under conclave.backends, class name)
BACKENDS: dict[str, tuple[str, str]] = {
    "openai": ("openai", "OpenAIBackend"),
    "anthropic": ("anthropic", "AnthropicBackend"),
    "gemini": ("gemini", "GeminiBackend"),
    "local": ("local", "LocalBackend"),
}
# providers whose backend is also a Scorer (base.py): a split turn votes by its log-probabilities
SCORERS = frozenset({"local"})
# providers whose module has `check_ready(model_name, model_path)`: what must be installed before a job
# starts (the hosted providers need only a key, which the team checks). Only these modules are imported
# at submit time, so a hosted provider's SDK is never imported just to admit a job.
PREFLIGHT = frozenset({"local"})
# the providers `preload` builds: the hosted ones, whose SDK costs a first job seconds of imports and
# client set-up ("local" is left out: its backend starts a llama.cpp server)
PRELOADED = ("openai", "anthropic", "gemini")


def check_ready(provider: str, model_name: str, model_path: str | None) -> None:
    """Raise ConfigError, saying what to install, when `provider/model_name` cannot run on this machine."""
    if provider in PREFLIGHT:
        import_module(f"{__name__}.{BACKENDS[provider][0]}").check_ready(model_name, model_path)


def create_backend(endpoint: Endpoint, *, local_servers: LocalServers | None = None) -> Backend:
    """The backend for `endpoint.provider`; ConfigError names the valid providers if it is unknown.

    `local_servers` is the pool `local` endpoints start their llama.cpp server in (see local.py).
    """
    try:
        module_name, class_name = BACKENDS[endpoint.provider]
    except KeyError:
        valid = ", ".join(sorted(BACKENDS))
        raise ConfigError(
            f"unknown provider {endpoint.provider!r} (model {endpoint.model!r}): "
            f"use one of {valid}, as in 'openai/gpt-5'"
        ) from None
    backend_class = getattr(import_module(f"{__name__}.{module_name}"), class_name)
    if endpoint.provider == "local":
        local: Backend = backend_class(endpoint, local_servers)
        return local
    backend: Backend = backend_class(endpoint)
    return backend


def create_scorer(endpoint: Endpoint, *, local_servers: LocalServers | None = None) -> ScoringBackend | None:
    """The backend for `endpoint` as a scorer when its provider's backend is one (`SCORERS`), else None."""
    if endpoint.provider not in SCORERS:
        return None
    module_name, class_name = BACKENDS[endpoint.provider]
    backend_class = getattr(import_module(f"{__name__}.{module_name}"), class_name)
    scorer: ScoringBackend = backend_class(endpoint, local_servers)
    return scorer


def preload() -> list[Backend]:
    """One backend of each hosted provider whose SDK is installed, built and never sent a request: its
    SDK's modules and its client's classes are loaded, and the shared TLS context (tls.py) made, before
    a first job needs them. Blocking (imports): run it in a worker thread, and close what it returns."""
    built = []
    for provider in PRELOADED:
        endpoint = Endpoint(provider=provider, model="preload", api_key="preload-sends-no-request")
        try:
            built.append(create_backend(endpoint))
        except (ConfigError, ImportError):  # its SDK is not installed: a team naming it fails at start
            continue
    return built
