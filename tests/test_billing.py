"""Every call a provider bills is counted once: a job's usage equals the fake providers' own bill, or is
above it only by what it marks as estimated (a call that reported nothing, because its turn was
cancelled or its worker was killed, is charged an estimate of its prompt). Real SDKs over HTTP to the
fakes (tests/fakes/), whose `bill` is the truth; a real `conclave serve --http` killed with SIGKILL
and taken over for the takeover."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path

import anyio.to_thread
import pytest
from fastmcp import Client
from rich.console import Console

from conclave.backends.base import Usage
from conclave.cli.render import render
from conclave.coordination.reports import AgentProgress
from conclave.jobs.read.views import JobView
from conclave.jobs.store.sql import Store
from conclave.settings import Settings
from tests.fakes.processes import HTTP_TOKEN, http_process
from tests.fakes.script import RecordedRequest, Reply, Script
from tests.fakes.server import FakeProviders
from tests.fakes.team import TRIO, install, is_presentation, vote_labels, voter
from tests.fakes.waits import answered_through, done_through
from tests.test_orchestrator import letters_of, run
from tests.test_resume import ASK, _trio_server

pytestmark = pytest.mark.anyio
APP_JS = Path(__file__).parent.parent / "server" / "web" / "static" / "app.js"


def assert_billed(script: Script, name: str, usage: Usage, cut: int = 0, refused: int = 0) -> None:
    """`usage` (one fake agent's, as the job counted it) against the fake's own bill: every request the
    fake received counted as one call (and up to `cut` more: a call cancelled as it started may not
    have reached its provider, yet is charged an estimate); what the providers reported never above
    their bill (nothing counted twice); the input at least the bill's, above it only by what is marked
    estimated. Output is at most the bill's: a fake bills the whole reply to a request its client had
    abandoned, output its client never saw (a real provider stops generating when the client goes).
    `refused`: requests the fake refused with an error, which bill nothing."""
    bill_in, bill_out, bill_cached = script.bill.get(name, (0, 0, 0))
    requests = len(script.requests_of(name)) - refused
    reported = usage.input_tokens - usage.estimated_input_tokens
    assert requests <= usage.calls <= requests + cut, (name, usage, requests)
    assert reported <= bill_in <= usage.input_tokens, (name, usage, script.bill.get(name))
    assert usage.output_tokens <= bill_out and usage.cached_input_tokens <= bill_cached, (name, usage)


def thinker_script(
    script: Script, letter_of: dict[str, str], thinker: str, how: str, cancelled: threading.Event
) -> None:
    """`thinker` answers, then thinks about a vote while the next agent's answer is still to come; that
    answer lands meanwhile and makes the thinking turn stale, which the orchestrator cancels. The think's
    reply is `held` by the fake until the cancel (its provider says nothing before it), or `stalled`
    after its first chunk (Anthropic's and Gemini's carry the input usage). The others vote as usual."""
    answerer = next(name for _, name in TRIO if name != thinker)
    thinks = threading.Event()
    usual = voter()

    def think(request: RecordedRequest) -> Reply:
        labels = vote_labels(request)
        mine = [label for label in labels if label.startswith(letter_of[thinker])]
        theirs = [label for label in labels if label.startswith(letter_of[answerer])]
        if is_presentation(request) or not mine or theirs or thinks.is_set():
            return usual(request)
        thinks.set()  # the answerer's answer goes now, while this reply is held
        vote = Reply(tool_calls=[("vote", {"answer": mine[0], "reason": "mine"})])
        if how == "held":
            vote.gate = cancelled
        else:
            vote.stall = 60.0  # longer than the test: only the cancel ends it
        return vote

    def answer_later(request: RecordedRequest) -> Reply:
        reply = usual(request)
        if not any(label.startswith(letter_of[answerer]) for label in vote_labels(request)):
            reply.gate = thinks
        return reply

    install(script, TRIO, usual)
    script.set_default(thinker, think)
    script.set_default(answerer, answer_later)


@pytest.mark.parametrize(
    ("thinker", "how"), [("ann", "held"), ("bob", "held"), ("bob", "stalled"), ("cy", "stalled")]
)
async def test_a_cancelled_turns_call_is_charged_what_its_provider_billed_or_an_estimate(
    fakes: FakeProviders, thinker: str, how: str
) -> None:
    letter_of = letters_of()
    cancelled = threading.Event()
    thinker_script(fakes.script, letter_of, thinker, how, cancelled)
    result, sink = await run(fakes, gates=(("turn_cancelled", letter_of[thinker], cancelled),))
    await anyio.to_thread.run_sync(fakes.settle)  # a held reply is billed once its gate opens

    assert result.consensus
    assert any(event.letter == letter_of[thinker] for event in sink.kinds("turn_cancelled"))
    agents = {agent.letter: agent for agent in sink.progress[-1].agents}
    for _, name in TRIO:
        cut = sum(event.letter == letter_of[name] for event in sink.kinds("turn_cancelled"))
        assert_billed(fakes.script, name, agents[letter_of[name]].usage, cut)
    thought = agents[letter_of[thinker]].usage
    # held: its provider said nothing before the cancel, so its input is an estimate; stalled: its
    # provider had reported the input at the stream's start, which is what it is charged (assert_billed)
    assert thought.estimated_input_tokens > 0 or how == "stalled", thought
    # the charge and its estimate were reported as they were made: the stored events add up
    charged = sum((e.charge for e in sink.kinds("usage") if e.letter == letter_of[thinker]), Usage())
    assert charged == thought


def usage_by_agent(home: Path, job_id: str) -> dict[str, AgentProgress]:
    """Each fake agent's progress (with its usage) as the store holds it, by the agent's name."""
    store = Store.of(Settings(home=home))
    try:
        row = store.job(job_id)
        assert row is not None and row.progress is not None
        return {name: a for a in row.progress.agents for _, name in TRIO if a.model.endswith(name)}
    finally:
        store.close()


async def test_a_job_killed_mid_call_and_taken_over_is_charged_every_request_once(tmp_path: Path) -> None:
    """The agents' vote calls are in flight at the kill: each was charged its estimate when it started,
    and that charge is in the store; the resumed job keeps it, charges nothing of it again, and counts
    its own calls as they come."""
    home = tmp_path / "home"
    with FakeProviders() as fakes:
        env = _trio_server(tmp_path, fakes, delay=1.0)
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                asked = JobView.model_validate((await client.call_tool("ask_team", ASK)).structured_content)
                await answered_through(client, asked.job_id, 3)
            process.send_signal(signal.SIGKILL)  # mid-job: the agents' vote calls are in flight
            process.wait()
            fakes.settle()
        killed = usage_by_agent(home, asked.job_id)
        assert sum(a.usage.estimated_input_tokens for a in killed.values()) > 0  # charged as they started
        with http_process(tmp_path, env) as (base, process):
            async with Client(f"{base}/mcp", auth=HTTP_TOKEN) as client:
                resumed = await done_through(client, asked.job_id)
            process.terminate()
            assert process.wait(timeout=60) == 0
        fakes.settle()
        assert resumed.state == "completed", resumed.phase
        stored = usage_by_agent(home, asked.job_id)
        cut = resumed_turns(home, asked.job_id)  # a call the kill cut may not have reached its provider
        for _, name in TRIO:
            assert_billed(fakes.script, name, stored[name].usage, int(stored[name].letter in cut))
            # the charges made before the kill are kept: the estimates of the calls it cut stay
            assert stored[name].usage.estimated_input_tokens == killed[name].usage.estimated_input_tokens
        total = sum((a.usage for a in stored.values()), Usage())
        requests = len(fakes.script.requests)
        assert resumed.usage == total and requests <= total.calls <= requests + len(cut)
    # every surface says which part is an estimate: get_status's text, the CLI's table, the web view's
    estimated = f"~{total.estimated_input_tokens:,} estimated"
    assert estimated in resumed.text()
    console = Console(width=200, record=True)
    console.print(render(resumed))
    shown = console.export_text()
    assert estimated in shown and "est.)" in shown
    cells = web_usage_cells(resumed)
    assert cells[-1][-1] == f"~{total.estimated_input_tokens:,}"  # the total row's "estimated in"


def resumed_turns(home: Path, job_id: str) -> list[str]:
    """The letters whose turns were in flight at the kill, run again by the takeover."""
    store = Store.of(Settings(home=home))
    try:
        (resumed,) = store.events(job_id, "resumed")
        return list(resumed.turns)
    finally:
        store.close()


def web_usage_cells(view: JobView) -> list[list[str]]:
    """The web view's usage table (server/web/static/app.js `usage`) for `view`, each row's cells' text,
    built by app.js itself under node with a minimal document."""
    script = """
const fs = require("fs"), vm = require("vm");
class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.textContent = ""; }
  append(child) { this.children.push(child); }
  setAttribute() {}
}
const document = { createElement: (tag) => new Node(tag), addEventListener() {}, body: { dataset: {} } };
const context = { document };
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), context);
const view = JSON.parse(fs.readFileSync(0, "utf8"));
const rows = context.usage(view).flatMap((part) => part.children);
console.log(JSON.stringify(rows.map((row) => row.children.map((cell) => cell.textContent))));
"""
    ran = subprocess.run(
        ["node", "-e", script, str(APP_JS)],
        input=view.model_dump_json(),
        capture_output=True,
        text=True,
        check=True,
    )
    rows: list[list[str]] = json.loads(ran.stdout)
    return rows


async def test_a_refused_request_is_charged_nothing_and_a_retried_call_once(fakes: FakeProviders) -> None:
    """ann's first request is refused with a 429 (billed nothing), then retried: one call, its
    provider's figures, no estimate left. cy's provider refuses every request (500s until the retries
    are spent): cy is charged nothing, though each of its calls was charged an estimate as it started."""
    install(fakes.script, TRIO[:2], voter())
    fakes.script.enqueue("ann", Reply(status=429))
    fakes.script.set_default("cy", Reply(status=500, error_message="gemini is down"))
    result, sink = await run(fakes)
    await anyio.to_thread.run_sync(fakes.settle)

    letter_of = letters_of()
    assert letter_of["cy"] in result.errors and result.winner is not None
    agents = {agent.letter: agent.usage for agent in sink.progress[-1].agents}
    ann, bob, cy = (agents[letter_of[name]] for name in ("ann", "bob", "cy"))
    assert cy == Usage() and "cy" not in fakes.script.bill and fakes.script.requests_of("cy")
    for name, used in (("ann", ann), ("bob", bob)):  # the 429 is no call
        cut = sum(event.letter == letter_of[name] for event in sink.kinds("turn_cancelled"))
        assert_billed(fakes.script, name, used, cut, refused=int(name == "ann"))
