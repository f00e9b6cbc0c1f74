"""One `Usage` for a report, a member's charges and a job's total: a charge without a cost keeps the cost
known so far and marks it partial; a price costs tokens; what older rows stored reads back whole."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conclave.backends.base import Usage
from conclave.config.models import Price
from conclave.coordination.reports import AgentProgress


def test_a_charge_without_a_cost_keeps_the_cost_so_far_and_marks_it_partial() -> None:
    """The cost bug of issue 28: 0.05, then a charge with no cost (no price, none reported), then 0.02
    made 0.02 (the charge without a cost wiped the 0.05); it is 0.07, at least, with 1,200 tokens
    uncovered."""
    total = Usage(100, 10, cost_usd=0.05) + Usage(1000, 200) + Usage(300, 20, cost_usd=0.02)
    assert total.cost_usd == pytest.approx(0.07)
    assert total.cost_partial and total.uncosted_tokens == 1200
    assert (total.input_tokens, total.output_tokens, total.tokens) == (1400, 230, 1630)
    # in any order: the first charge without a cost does not hide the costs after it either
    assert (Usage(1000, 200) + Usage(100, 10, cost_usd=0.05) + Usage(300, 20, cost_usd=0.02)) == total


def test_no_cost_anywhere_is_no_cost_and_nothing_uncharged_is_not_partial() -> None:
    unpriced = Usage(1000, 200) + Usage(10, 2)
    assert unpriced.cost_usd is None and not unpriced.cost_partial
    assert Usage() + Usage(10, 1, cost_usd=0.01) == Usage(10, 1, cost_usd=0.01)  # no tokens, nothing partial
    whole = Usage(10, 1, cost_usd=0.01) + Usage(20, 2, cost_usd=0.02)
    assert not whole.cost_partial and whole.cost_usd == pytest.approx(0.03)


def test_a_price_costs_the_tokens_and_a_reported_cost_wins() -> None:
    price = Price(input=2.0, output=10.0, cached_input=0.5)
    usage = Usage(1_000_000, 100_000, 400_000)
    assert usage.priced(price).cost_usd == pytest.approx(600_000 * 2e-6 + 400_000 * 0.5e-6 + 1.0)
    assert usage.priced(Price(input=2.0, output=10.0)).cost_usd == pytest.approx(2.0 + 1.0)
    assert usage.priced(None) == usage  # no price: no cost, never a guessed one
    assert usage.costing(0.25).priced(price).cost_usd == 0.25  # a CLI's own figure is the cost


def test_a_final_charge_with_the_whole_runs_cost_takes_back_its_uncosted_tokens() -> None:
    """A CLI run charged mid-run without a cost, then its whole cost at the end (clis/meter.py): the
    difference makes the member's cost whole again."""
    before = Usage(500, 50, cost_usd=0.1)  # earlier runs
    mid = Usage(2000, 30)  # the run so far, no cost yet
    member = before + mid
    assert member.cost_partial and member.cost_usd == pytest.approx(0.1)
    final = Usage(2100, 90).costing(0.17)
    member = member + (final - mid)
    assert member == before + final and not member.cost_partial
    assert member.cost_usd == pytest.approx(0.27) and member.tokens == 500 + 50 + 2100 + 90


usages = st.builds(
    Usage,
    st.integers(0, 10**6),
    st.integers(0, 10**5),
    st.just(0),
    cost_usd=st.one_of(st.none(), st.integers(0, 10**4).map(lambda cents: cents / 100)),
)


@given(st.lists(usages, max_size=6), st.lists(usages, max_size=6))
def test_sums_keep_every_known_cost_and_count_every_uncosted_token(a: list[Usage], b: list[Usage]) -> None:
    total = sum(a, Usage()) + sum(b, Usage())
    parts = a + b
    costs = [part.cost_usd for part in parts if part.cost_usd is not None]
    assert total.cost_usd == (pytest.approx(sum(costs)) if costs else None)
    uncosted = sum(part.tokens for part in parts if part.cost_usd is None)
    assert total.uncosted_tokens == (uncosted if costs else 0)
    assert total.cost_partial == bool(costs and uncosted)
    assert (total - sum(b, Usage())).tokens == sum(part.tokens for part in a)


def test_usage_stored_before_the_cost_was_split_reads_back_whole() -> None:
    """A progress row written before `uncosted_tokens` (its cost, when there was one, covered every
    token) reads back as it was; an unknown field is refused, not dropped."""
    old = {"letter": "A", "model": "m", "state": "done", "usage": {"calls": 2, "input_tokens": 10,
           "output_tokens": 3, "cached_input_tokens": 0, "cost_usd": 0.5}}  # fmt: skip
    agent = AgentProgress.model_validate(old)
    assert agent.usage == Usage(10, 3, 0, cost_usd=0.5, calls=2) and not agent.usage.cost_partial
    with pytest.raises(ValueError, match="surprise"):
        AgentProgress.model_validate({**old, "usage": {**old["usage"], "surprise": 1}})  # type: ignore[dict-item]
