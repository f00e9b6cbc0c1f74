"""Every backend's HTTP client shares one TLS context (backends/tls.py), and it still verifies servers.

The fake providers are served over HTTPS with a certificate from a test CA: a backend reaches them when
`SSL_CERT_FILE` names that CA, as the SDKs' own contexts do, and refuses them when it does not.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from conclave.backends import create_backend
from conclave.backends.base import Endpoint, Message, Request, TextDelta
from conclave.backends.tls import client_context
from conclave.errors import ProviderError
from tests.fakes.script import Reply, Script
from tests.fakes.server import PREFIXES, build_app, free_port
from tests.fakes.threaded import serving
from tests.fakes.tls_ca import TestCa

pytestmark = pytest.mark.anyio
PROVIDERS = ["openai", "anthropic", "gemini"]
REQUEST = Request(system="You are agent A.", messages=(Message("user", "Say hi."),))


@pytest.fixture(scope="module")
def tls_fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Script, int, Path]]:
    """The fake providers over HTTPS on 127.0.0.1: (script, port, the CA's certificate file)."""
    ca = TestCa.create(tmp_path_factory.mktemp("tls"), ["127.0.0.1"])
    script, port = Script(), free_port()
    config = uvicorn.Config(
        build_app(script),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        ssl_certfile=str(ca.cert_file),
        ssl_keyfile=str(ca.key_file),
        timeout_graceful_shutdown=1,
    )
    with serving(config, "tls-fakes"):
        yield script, port, ca.ca_file


async def _ask(provider: str, port: int, script: Script) -> str:
    agent = f"tls-{uuid.uuid4().hex[:8]}"
    script.enqueue(agent, Reply(text=f"hi from {provider}"))
    url = f"https://127.0.0.1:{port}" + PREFIXES[provider].format(agent=agent)
    backend = create_backend(
        Endpoint(
            provider=provider, model=f"{provider}-model", api_key="tls-key-0123", base_url=url, timeout_s=10
        )
    )
    try:
        return "".join([e.text async for e in backend.stream(REQUEST) if isinstance(e, TextDelta)])
    finally:
        await backend.aclose()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_backend_reaches_a_server_its_ca_file_trusts(
    provider: str, tls_fakes: tuple[Script, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, port, ca = tls_fakes
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    assert await _ask(provider, port, script) == f"hi from {provider}"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_backend_refuses_a_server_it_does_not_trust(
    provider: str, tls_fakes: tuple[Script, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, port, _ = tls_fakes
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with pytest.raises(ProviderError):  # the test CA is not in the system's trust store
        await _ask(provider, port, script)


def test_one_context_per_trust_setting(
    tls_fakes: tuple[Script, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_fakes[2]))
    shared = client_context()
    assert client_context() is shared  # built once, not once a backend
    monkeypatch.delenv("SSL_CERT_FILE")
    assert client_context() is not shared  # another trust store, another context


@pytest.mark.parametrize("provider", PROVIDERS)
def test_building_a_backend_loads_no_trust_store(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client_context()  # the process's context, made once
    loads: list[str] = []
    for name in ("load_verify_locations", "load_default_certs", "set_default_verify_paths"):
        real = getattr(ssl.SSLContext, name)

        def counted(
            self: ssl.SSLContext, *args: object, _real: object = real, _name: str = name, **kwargs: object
        ) -> object:
            loads.append(_name)
            return _real(self, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(ssl.SSLContext, name, counted)
    create_backend(
        Endpoint(
            provider=provider,
            model=f"{provider}-model",
            api_key="tls-key-0123",
            base_url="https://127.0.0.1:9",
        )
    )
    assert loads == []  # each SDK client would otherwise read the trust store again (about 15 ms)
