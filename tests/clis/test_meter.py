"""A CLI member's runs charged through the meter as Claude Code's output reports them, without a
container: its mid-run charges come without a cost and its result with the whole run's, so the member's
cost is every run's cost, partial only while a run goes or after one killed before its result."""

from __future__ import annotations

import json

import pytest

from conclave.backends.base import Usage
from conclave.clis.member import CliMember
from conclave.clis.meter import Meter
from conclave.config.loading import parse_team
from conclave.coordination.members import Member

pytestmark = pytest.mark.anyio
PROMPT = "Fix add() in calc.py."


def _stream(*events: dict[str, object]) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


def _start(input_tokens: int, output: int = 1) -> dict[str, object]:
    usage = {"input_tokens": input_tokens, "cache_read_input_tokens": 0, "output_tokens": output}
    return {"type": "stream_event", "event": {"type": "message_start", "message": {"usage": usage}}}


def _delta(output: int) -> dict[str, object]:
    return {"type": "stream_event", "event": {"type": "message_delta", "usage": {"output_tokens": output}}}


def _result(input_tokens: int, output: int, cost: float) -> dict[str, object]:
    usage = {"input_tokens": input_tokens, "output_tokens": output}
    return {"type": "result", "result": "done", "usage": usage, "total_cost_usd": cost}


class Job:
    """A job's member for the CLI, charged as the orchestrator charges it (coordination/members.py)."""

    def __init__(self, member: CliMember) -> None:
        self.cli, self.member, self.charges = member, Member(member.spec, "A"), list[Usage]()

    async def charge(self, usage: Usage, first: bool) -> None:
        self.charges.append(self.member.charge(usage, first))

    @property
    def usage(self) -> Usage:
        return self.member.usage

    def meter(self) -> Meter:
        """One run's meter, reading the run's output as the member does (clis/member.py)."""
        return Meter(
            lambda out: self.cli.streamed(PROMPT, out),
            lambda out: self.cli.reported(PROMPT, out),
            self.charge,
            self.cli.spec.price,
        )


def claude_code(price: dict[str, float] | None = None) -> CliMember:
    spec = parse_team({"agents": [{"model": "cli/claude-code", "api_key_env": "K", "price": price}]}, "t")
    return CliMember.for_spec(spec.agents[0], {"K": "key-0123456789"})


async def test_claude_codes_runs_sum_their_costs_though_each_is_charged_without_one_midway() -> None:
    """Issue 28's run: runs of $0.1615 and $0.1097 made the member's cost $0.1097 (the second run's
    first charge, without a cost, wiped the first run's); it is $0.2712, partial only midway."""
    job = Job(claude_code())
    first, second = _stream(_start(3000), _delta(40)), _stream(_start(5000), _delta(60))
    meter = job.meter()
    await meter.update(first)
    assert job.usage.cost_usd is None and job.usage.tokens == 3040  # no cost known yet: none shown
    await meter.update(first + _stream(_result(3000, 40, 0.1615)), final=True)
    assert job.usage.cost_usd == pytest.approx(0.1615) and not job.usage.cost_partial

    meter = job.meter()
    await meter.update(second)
    assert job.charges[-1].cost_usd is None and job.charges[-1].tokens == 5060  # the bug's charge
    assert job.usage.cost_usd == pytest.approx(0.1615) and job.usage.cost_partial
    assert job.usage.uncosted_tokens == 5060
    await meter.update(second + _stream(_result(5000, 60, 0.1097)), final=True)
    assert job.usage.cost_usd == pytest.approx(0.2712) and not job.usage.cost_partial
    assert job.usage.calls == 2 and job.usage.tokens == 3040 + 5060


async def test_a_run_killed_before_its_result_leaves_the_cost_partial() -> None:
    job = Job(claude_code())
    first, second = _stream(_start(3000), _delta(40)), _stream(_start(5000), _delta(60))
    meter = job.meter()
    await meter.update(first + _stream(_result(3000, 40, 0.1615)), final=True)
    meter = job.meter()
    await meter.update(second)
    await meter.update(second, final=True)  # killed: what its stream said, no result, no cost
    assert job.usage.cost_usd == pytest.approx(0.1615) and job.usage.cost_partial
    assert job.usage.uncosted_tokens == 5060 and job.usage.tokens == 3040 + 5060


async def test_a_priced_claude_code_member_is_charged_its_price_midway_and_its_own_cost_at_the_end() -> None:
    """With a price the mid-run charges are priced (a budget can stop a run midway) and the result's
    cost replaces that figure for the run: the member's cost is the CLI's, never twice."""
    job = Job(claude_code({"input": 10.0, "output": 100.0}))
    output = _stream(_start(2000), _delta(50))
    meter = job.meter()
    await meter.update(output)
    assert job.usage.cost_usd == pytest.approx((2000 * 10 + 50 * 100) / 1e6) and not job.usage.cost_partial
    await meter.update(output, final=True)  # killed: the price's figure stays
    meter = job.meter()
    await meter.update(output)
    await meter.update(output + _stream(_result(2000, 50, 0.04)), final=True)
    assert job.usage.cost_usd == pytest.approx(0.025 + 0.04) and not job.usage.cost_partial


def codex() -> CliMember:
    spec = parse_team({"agents": [{"model": "cli/codex", "api_key_env": "K"}]}, "t")
    return CliMember.for_spec(spec.agents[0], {"K": "key-0123456789"})


async def test_a_plan_runs_estimate_stays_marked_when_it_is_killed_and_goes_when_it_reports() -> None:
    """Codex says its tokens only at the end: midway (a plan login has no proxy to meter its calls) the
    run is charged an estimate, marked; a run killed keeps the mark, a run that reports loses it."""
    job = Job(codex())
    printed = _stream({"type": "item.started", "item": {"type": "command_execution", "command": "pytest"}})
    meter = job.meter()
    await meter.update(printed)
    guessed = len(PROMPT) // 4 + 1
    assert job.usage.estimated_input_tokens == guessed and job.usage.input_tokens == guessed
    await meter.update(printed + printed)  # more output: the input estimate is unchanged, still marked
    await meter.update(printed + printed, final=True)  # killed: what was estimated stays, marked
    assert job.usage.estimated_input_tokens == guessed

    meter = job.meter()
    await meter.update(printed)
    done = {"type": "turn.completed", "usage": {"input_tokens": 900, "output_tokens": 30}}
    await meter.update(printed + _stream(done), final=True)  # its own report replaces its estimate
    assert job.usage.input_tokens == guessed + 900 and job.usage.estimated_input_tokens == guessed
