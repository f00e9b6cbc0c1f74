"""The protocol's journal: every event the protocol took, in order, so a job whose process died is
rebuilt by feeding them again to a fresh state machine (protocol.py is pure: the same events give the
same state, turn ids and actions).

The orchestrator appends each event after the protocol took it and before anything it caused is
reported; a job that resumes (jobs/run/lifecycle.py) replays its journal, then runs again only the turns
(and the presentation) that were in flight. Events are stored as JSON: the class name and its fields.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol

from conclave.coordination.protocol_events import (
    AnswerPosted,
    Deadline,
    NoDecision,
    PresentationFailed,
    Presented,
    ProtocolEvent,
    Start,
    Steer,
    Stop,
    TurnFailed,
    Verified,
    VoteCast,
    WorkStarted,
)
from conclave.coordination.tally import StopReason

_KINDS: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        Start,
        Deadline,
        Stop,
        Steer,
        Verified,
        WorkStarted,
        AnswerPosted,
        VoteCast,
        NoDecision,
        TurnFailed,
        Presented,
        PresentationFailed,
    )
}


class Journal(Protocol):
    """Where a job's protocol events are kept, in the order the protocol took them."""

    async def append(self, event: ProtocolEvent) -> None: ...


def encode(event: ProtocolEvent) -> str:
    """One event as JSON: {"event": class name, **fields}."""
    fields = dataclasses.asdict(event)
    if isinstance(event, Stop):
        fields["cause"] = event.cause.value
    return json.dumps({"event": type(event).__name__, **fields})


def decode(text: str) -> ProtocolEvent:
    """The event `encode` wrote; ValueError for anything else."""
    data = json.loads(text)
    cls = _KINDS.get(data.pop("event", None))
    if cls is None:
        raise ValueError(f"not a protocol event: {text[:200]}")
    if cls is Stop:
        data["cause"] = StopReason(data.get("cause", StopReason.BUDGET.value))
    event: ProtocolEvent = cls(**data)
    return event
