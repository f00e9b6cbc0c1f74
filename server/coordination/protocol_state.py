"""What the protocol (protocol.py) keeps per agent: its answers, its vote, its turn in flight, why it failed.

Plain mutable records the state machine owns; nothing else writes them (the driver reads them through
picture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Phase = Literal["coordinating", "presenting", "done"]
Rule = Literal["all_voted", "majority"]


@dataclass(frozen=True)
class Vote:
    voter: str
    label: str
    reason: str


@dataclass(frozen=True)
class Turn:
    turn_id: int
    version: int
    did_work: bool = False
    corrective: bool = False


@dataclass(frozen=True)
class Deferred:
    """A turn held back while a current answer is being checked: it starts, as it was asked for, once
    the results are in."""

    note: str
    corrective: bool = False


@dataclass
class AgentState:
    letter: str
    answers: int = 0
    vote: Vote | None = None
    turn: Turn | None = None
    failed_turns: int = 0
    error: str | None = None
    waiting: Deferred | None = None  # with `verify`: its next turn, until the checks are in

    @property
    def active(self) -> bool:
        return self.error is None
