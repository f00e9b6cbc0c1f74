"""Model backends: one module per provider behind the `Backend` seam of `base.py`.

    backend = create_backend(Endpoint(provider="openai", model="gpt-5", api_key=key))
    completion = await retry.complete(backend, request, RetryPolicy())
    await backend.aclose()

`create_backend` imports a provider's module only when an endpoint asks for it, so a missing SDK
breaks only the teams that use it. Which module, and what its backend can do, is the provider's entry in
config/providers.py. Each backend maps its SDK's exceptions to `conclave.errors`;
`retry.py` holds the retry loop every backend shares.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from conclave.backends.base import Backend, Endpoint, ScoringBackend
from conclave.config.providers import PROVIDERS, Provider
from conclave.errors import ConfigError

if TYPE_CHECKING:
    from conclave.backends.llama_server import LocalServers


def check_ready(provider: str, model_name: str, model_path: str | None) -> None:
    """Raise ConfigError, saying what to install, when `provider/model_name` cannot run on this machine.

    Only a provider whose entry says `checks_ready` has its module imported here (at submit time), so a
    hosted provider's SDK is never imported just to admit a job."""
    entry = PROVIDERS.get(provider)
    if entry is not None and entry.checks_ready:
        import_module(entry.backend_module).check_ready(model_name, model_path)


def _backend_class(entry: Provider) -> type[Any]:
    found: type[Any] = getattr(import_module(entry.backend_module), entry.backend_class)
    return found


def create_backend(endpoint: Endpoint, *, local_servers: LocalServers | None = None) -> Backend:
    """The backend for `endpoint.provider`; ConfigError names the valid providers if it is unknown.

    `local_servers` is the pool a provider that `takes_local_servers` starts its model server in (local.py).
    """
    entry = PROVIDERS.get(endpoint.provider)
    if entry is None or not entry.backend:
        valid = ", ".join(sorted(p.name for p in PROVIDERS.with_backends()))
        raise ConfigError(
            f"unknown provider {endpoint.provider!r} (model {endpoint.model!r}): "
            f"use one of {valid}, as in 'openai/gpt-5'"
        )
    backend_class = _backend_class(entry)
    backend: Backend = (
        backend_class(endpoint, local_servers) if entry.takes_local_servers else backend_class(endpoint)
    )
    return backend


def create_scorer(endpoint: Endpoint, *, local_servers: LocalServers | None = None) -> ScoringBackend | None:
    """The backend for `endpoint` as a scorer when its provider's entry says it `scores`, else None."""
    entry = PROVIDERS.get(endpoint.provider)
    if entry is None or not entry.scores:
        return None
    scorer: ScoringBackend = _backend_class(entry)(endpoint, local_servers)
    return scorer


def preload() -> list[Backend]:
    """One backend of each `preloaded` provider whose SDK is installed, built and never sent a request: its
    SDK's modules and its client's classes are loaded, and the shared TLS context (tls.py) made, before
    a first job needs them. Blocking (imports): run it in a worker thread, and close what it returns."""
    built = []
    for entry in PROVIDERS.values():
        if not entry.preloaded:
            continue
        endpoint = Endpoint(provider=entry.name, model="preload", api_key="preload-sends-no-request")
        try:
            built.append(create_backend(endpoint))
        except (ConfigError, ImportError):  # its SDK is not installed: a team naming it fails at start
            continue
    return built
