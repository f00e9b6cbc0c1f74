"""A running job's picture, read from the protocol state: the live progress, what leads, the answers shown.

Queries only: nothing here changes the state (the orchestrator, orchestrator.py, is its one writer).
"""

from __future__ import annotations

from collections.abc import Mapping

from conclave.coordination import protocol
from conclave.coordination.members import Member
from conclave.coordination.reports import AgentProgress, AgentStateName, Check, Leading, Progress, ShownAnswer

PREVIEW = 200  # characters of the leading answer in the progress


def progress(
    state: protocol.Coordination,
    members: Mapping[str, Member],
    checks: Mapping[str, Check],
    verify_blocked: str | None = None,
) -> Progress:
    """Each agent's state, answers and vote, the tally, the round, and the notes the agents see; with
    verify, each answer's check and why the command cannot run on the caller's files, if it cannot."""
    agents = []
    for letter, member in sorted(members.items()):
        agent = state.agents[letter]
        name: AgentStateName = (
            ("stopped" if member.limit.reason is not None else "failed")
            if not agent.active
            else "working"
            if agent.turn
            else "voted"
            if agent.vote
            else "waiting"
        )
        if member.presenting:
            name = "presenting"
        elif state.phase == "done" and agent.active:
            name = "done"
        vote = agent.vote.label if agent.vote else None
        agents.append(
            AgentProgress(
                letter=letter,
                model=member.spec.model,
                state=name,
                answers=agent.answers,
                vote=vote,
                error=agent.error,
                usage=member.usage,
                max_tokens=member.limit.max_tokens,
            )
        )
    agree = [list(group) for group in state.agreeing()]
    return Progress(
        phase=state.phase,
        round=state.version,
        agents=agents,
        tally=state.tally(),
        agree=agree,
        checks=dict(checks),
        verify_blocked=verify_blocked,
        leading=leading(state, checks),
        notes=list(state.notes),
    )


def leading(state: protocol.Coordination, checks: Mapping[str, Check]) -> Leading | None:
    """What would win now: the best supported while coordinating, the winner while it presents."""
    lead = state.leading() if state.phase == "coordinating" else None
    lead = state.outcome if state.phase == "presenting" else lead
    answer = state.answer(lead.winner) if lead and lead.winner else None
    if lead is None or answer is None:
        return None
    check = checks.get(answer.label)
    return Leading(
        label=answer.label,
        votes=lead.votes,
        check=check.text() if check else None,
        preview=answer.content[:PREVIEW],
    )


def shown(
    state: protocol.Coordination, checks: Mapping[str, Check], order: tuple[str, ...] = ()
) -> list[ShownAnswer]:
    """The current answers, in a voter's `order` (else posting order), each with those agreeing and its
    votes now (no prompt shows them: a CLI member skips a decision its vote cannot change, cli_turns.py)."""
    latest = {answer.label: answer for answer in state.latest_answers()}
    labels = [label for label in order if label in latest] + [label for label in latest if label not in order]
    groups, tally = state.agreeing(), state.tally()
    found = []
    for label in labels:
        others = next((tuple(o for o in group if o != label) for group in groups if label in group), ())
        shown = ShownAnswer.of(latest[label], checks.get(label), agrees_with=others, votes=tally[label])
        found.append(shown)
    return found
