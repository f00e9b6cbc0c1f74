"""The protocol's vocabulary: the events fed to it and the actions it returns (protocol.py holds the state).

Pure data, frozen dataclasses; turn events carry the turn id the protocol gave out.
"""

from __future__ import annotations

from dataclasses import dataclass

from conclave.coordination.tally import Outcome, StopReason


# Events: what happened. Turn events carry the turn id the protocol gave out; late ones are ignored.
@dataclass(frozen=True)
class Start:
    """The job begins: every agent gets its first turn."""


@dataclass(frozen=True)
class Deadline:
    reason: str


@dataclass(frozen=True)
class Stop:  # end now without another model call (a budget): the best-supported answer as it stands
    reason: str
    cause: StopReason = StopReason.BUDGET  # the outcome's `stopped_by`


@dataclass(frozen=True)
class Steer:  # the person who asked added a note: every later turn sees it, votes so far are cleared
    note: str


@dataclass(frozen=True)
class Verified:  # the check command's result for answer `label`, run after a `Verify` action
    label: str
    passed: bool


@dataclass(frozen=True)
class TurnEvent:
    letter: str
    turn_id: int


@dataclass(frozen=True)
class WorkStarted(TurnEvent):
    """The turn made its first work-tool call: from now on it is not cancelled when it goes stale."""


@dataclass(frozen=True)
class AnswerPosted(TurnEvent):
    content: str
    key: str = ""  # the driver's normalised final answer of `content` ("" groups identical texts only)


@dataclass(frozen=True)
class VoteCast(TurnEvent):
    label: str
    reason: str = ""


@dataclass(frozen=True)
class NoDecision(TurnEvent):
    text: str
    key: str = ""  # as in AnswerPosted: on a corrective turn the text becomes an answer


@dataclass(frozen=True)
class TurnFailed(TurnEvent):
    error: str
    fatal: bool = False  # the provider kept failing after retries: the agent is out
    refused: bool = False  # the driver refused the turn's answer (answers.py read_decision says why)


@dataclass(frozen=True)
class Presented:
    text: str


@dataclass(frozen=True)
class PresentationFailed:
    error: str


# Every event, each class named: protocol.py's `apply` matches them all (typing.assert_never checks it).
TurnEvents = WorkStarted | AnswerPosted | VoteCast | NoDecision | TurnFailed
ProtocolEvent = Start | Deadline | Stop | Steer | Verified | TurnEvents | Presented | PresentationFailed


# Actions: what the driver must do.
@dataclass(frozen=True)
class StartTurn:
    letter: str
    turn_id: int
    version: int
    can_answer: bool
    labels: tuple[str, ...]  # the current latest answers, in this voter's order: the only valid targets
    corrective: bool = False  # the last turn ended without new_answer/vote
    note: str = ""  # why this turn, for the agent (e.g. an invalid vote)
    notes: tuple[str, ...] = ()  # the steering notes so far, oldest first: every turn shows them all


@dataclass(frozen=True)
class CancelTurn:
    letter: str
    turn_id: int


@dataclass(frozen=True)
class Verify:  # run the check command on answer `label`'s files, then feed back `Verified`
    label: str


@dataclass(frozen=True)
class Present:
    letter: str
    outcome: Outcome


@dataclass(frozen=True)
class Finish:
    outcome: Outcome
    final_text: str | None  # the presented text; None means "use the winner's answer as it stands"


Action = StartTurn | CancelTurn | Verify | Present | Finish
