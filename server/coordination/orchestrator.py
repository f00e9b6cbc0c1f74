"""Run one job: agents' turns concurrently, their decisions fed to the protocol, its actions carried out.

All turns run in one task group; each has its own cancel scope so a stale turn can be cancelled and
restarted. Turns report back over a memory stream and one loop feeds the protocol, so the state has a
single writer. Every event is reported to the sink with the live progress, and the result is built
once from the protocol's outcome (reporting.py).
The driver reads every answer before the protocol sees it (answers.py): its key, or why it is no
answer; and a presentation that changes the winning final answer is refused. With `verify`, each
answer's check runs as a task beside the turns (verification.py) and comes back as `Verified`; with a
budget, every Usage is charged to it (budget.py) and reaching it feeds the protocol a `Stop`. A
steering note (`steer`) joins the same stream as a `Steer`; a follow-up's `history` and its
conversation's first job (`conversation_root`, for the same letters) come from the caller
(jobs/context/follow_ups.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, assert_never

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from conclave.backends.base import ToolCall, Usage
from conclave.backends.retry import RetryPolicy
from conclave.config.models import Team
from conclave.coordination import answers, picture, prompts, protocol
from conclave.coordination.agents import Agent, AgentFactory
from conclave.coordination.budget import JobBudget
from conclave.coordination.cli_turns import CLI_WORK
from conclave.coordination.job_files import Files, NoFiles
from conclave.coordination.journal import Journal
from conclave.coordination.limits import ProviderLimits
from conclave.coordination.members import JobSink, Member, assign_letters, seed_for
from conclave.coordination.protocol_events import (
    Action,
    CancelTurn,
    Deadline,
    Finish,
    Present,
    PresentationFailed,
    Presented,
    ProtocolEvent,
    Start,
    StartTurn,
    Steer,
    TurnFailed,
    Verified,
    Verify,
    WorkStarted,
)
from conclave.coordination.reporting import Reporter
from conclave.coordination.reports import (
    AnswerRefusedEvent,
    Check,
    CheckStartedEvent,
    DeadlineEvent,
    JobEvent,
    JobResult,
    PresentingEvent,
    Progress,
    ResumedEvent,
    Seat,
    ShownAnswer,
    SnapshotFailedEvent,
    StartedEvent,
    ToolCallEvent,
    TurnCancelledEvent,
    TurnStartedEvent,
    UsageEvent,
    VerifyBlockedEvent,
)
from conclave.coordination.tally import StopReason
from conclave.coordination.turn_context import TurnContext
from conclave.errors import ConclaveError, ProviderError

if TYPE_CHECKING:
    from conclave.coordination.verification import Verifier

__all__ = ["Orchestrator", "Resume", "Shared"]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resume:
    """A job taken over after its process died: its journal, each member's usage so far, how long it
    had run (its events' times go on from there), and the checks whose results were reported (by
    answer label): those are not run again."""

    events: Sequence[ProtocolEvent]
    usage: Mapping[str, Usage]
    elapsed: float
    checks: Mapping[str, Check] = field(default_factory=dict)


@dataclass(frozen=True)
class Shared:
    """What every job of a process runs with: how its agents are made (members.py `endpoint_factory`,
    the one place their kind is decided), how patiently provider calls are retried, and the
    per-provider limits all of its jobs count against (limits.py)."""

    agent_factory: AgentFactory
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    limits: ProviderLimits = field(default_factory=ProviderLimits)


class Orchestrator:
    """One job's run, from the first turns to the result."""

    def __init__(
        self,
        job_id: str,
        task: str,
        team: Team,
        sink: JobSink,
        shared: Shared,
        *,
        files: Files | None = None,
        verifier: Verifier | None = None,
        deadline: float | None = None,
        history: str = "",
        conversation_root: str | None = None,
        journal: Journal | None = None,
        resume: Resume | None = None,
    ) -> None:
        self.job_id, self.task, self.team, self.sink = job_id, task, team, sink
        self.history = history  # a follow-up's earlier rounds, shown before its task (prompts.py)
        # the job's end on anyio's clock when the caller's set-up (copying the context) already used
        # part of its timeout; else the timeout counts from `run`
        self._deadline_at = deadline
        self._factory, self._retry, self._limiters = shared.agent_factory, shared.retry, shared.limits
        clock = self._clock = anyio.current_time
        self.files: Files = files or NoFiles()  # a job without context paths: calls that do nothing
        self.verifier = verifier
        rules = team.coordination
        self.budget = JobBudget(rules.max_tokens, rules.max_cost_usd)
        # a follow-up's agents keep the letters of the conversation's first job (same team, same seed)
        letters = assign_letters(len(team.agents), seed_for(conversation_root or job_id))
        self.members = {
            letter: Member(spec, letter) for spec, letter in zip(team.agents, letters, strict=True)
        }
        self.state = protocol.Coordination(
            sorted(self.members),
            max_answers=rules.max_answers_per_agent,
            consensus=rules.consensus,
            present=rules.final == "present",
            max_failed_turns=rules.max_failed_turns,
            seed=seed_for(job_id),
            verify=verifier is not None,
        )
        secrets = self.files.secrets  # the job's (files/secrets.py)
        self.reports = Reporter(sink, self.state, self.members, clock, secrets)  # events, progress, result
        self._journal = journal  # every event the protocol takes, for a resume (journal.py)
        self._resume = resume
        self._owed: list[Action] = []  # a resumed job's actions still owed (`_replay`)
        if resume is not None:  # what the members had used before: budgets hold across the takeover
            for letter, used in resume.usage.items():
                self.members[letter].usage = used
            self.budget.charge(sum(resume.usage.values(), Usage()))
            self.reports.checks.update(resume.checks)
            self._owed = self._replay(resume.events)  # pure: the state is rebuilt before the set-up
        self._scopes: dict[int, anyio.CancelScope] = {}
        self._result: JobResult | None = None
        self._send, self._receive = anyio.create_memory_object_stream[ProtocolEvent](math.inf)

    # Public --------------------------------------------------------------------------------------
    async def run(self) -> JobResult:
        """Run the job to its result. Cancelling the caller cancels every turn.

        The job's timeout covers it all: set-up (workspaces, containers, backends), the vote and the
        presentation, so no slow step carries the job past it.
        """
        self.reports.started = self._clock() - (self._resume.elapsed if self._resume else 0.0)
        timeout = self.team.coordination.timeout_s
        deadline = self._deadline_at if self._deadline_at is not None else anyio.current_time() + timeout
        send, receive = self._send, self._receive
        try:
            async with anyio.create_task_group() as tg, send, receive:
                if self.verifier is not None:  # the check containers and the caller's files' run, from
                    # the job's start: the first answer's check then finds both ready (verification.py)
                    tg.start_soon(self._warm_checks, min(len(self.members), self.verifier.concurrency))
                with anyio.move_on_after(deadline - anyio.current_time()) as setting_up:
                    await self._set_up()
                if not setting_up.cancelled_caught:
                    await self._coordinate(tg, send, receive, deadline)
                tg.cancel_scope.cancel()
            if setting_up.cancelled_caught:
                return await self._ended_in_set_up(
                    f"the job reached its timeout of {timeout:g} s while setting up"
                )
        finally:
            self._send.close()  # a note from now on finds the job over (steer says so)
            with anyio.CancelScope(shield=True):
                if self.verifier is not None:  # its containers mount folders of checks/
                    await self.verifier.close()
                await self.files.close()
                for member in self.members.values():
                    if member.agent is not None:
                        await member.agent.aclose()
        assert self._result is not None  # the loop above ran until there was one
        return self._result

    async def _coordinate(
        self,
        tg: anyio.abc.TaskGroup,
        send: MemoryObjectSendStream[ProtocolEvent],
        receive: MemoryObjectReceiveStream[ProtocolEvent],
        deadline: float,
    ) -> None:
        """From the agents' first turns (or, on a resume, the turns that were in flight) to the result:
        the protocol's loop."""
        if self._resume is None:
            seats = tuple(Seat(letter=m.letter, model=m.spec.model) for m in self.members.values())
            await self._emit(StartedEvent(agents=seats))
        tg.start_soon(self._deadline, send.clone(), deadline)
        if self.budget.limited:
            tg.start_soon(self.budget.watch, send.clone())
        if self._resume is None:
            while (early := _pending(receive)) is not None:  # notes that came before the first turns
                await self._handle(early, tg, send)
            await self._journal_event(Start())
            await self._execute(self.state.apply(Start()), tg, send)
        else:  # the journal replayed (in __init__); what was in flight runs again, then any note that
            # came while the job was down, taken by the loop below in journal order like any event
            in_flight = self._owed
            turns = tuple(a.letter for a in in_flight if isinstance(a, StartTurn))
            checks = tuple(a.label for a in in_flight if isinstance(a, Verify))
            await self._emit(ResumedEvent(events=len(self._resume.events), turns=turns, checks=checks))
            await self._execute(in_flight, tg, send)
        while self._result is None:
            await self._handle(await receive.receive(), tg, send)

    async def _set_up(self) -> None:
        agents: dict[str, Agent] = {}
        for member in self.members.values():
            # SDK imports and client set-up block for seconds on first use: keep them off the loop, and
            # let the deadline abandon them (a client made after it is simply dropped).
            agent = await anyio.to_thread.run_sync(
                self._factory, member.spec, abandon_on_cancel=True, limiter=self._limiters.building
            )
            member.agent = agents[member.letter] = agent  # closed at the job's end, however set-up ends
        # workspaces and containers, each of the kind its agent says, before the agents' tools need them;
        # a resumed job's workspaces are rebuilt from the snapshots of the answers its journal kept
        posted = [answer.label for answer in self.state.answers] if self._resume is not None else None
        await self.files.start(agents, posted)
        for member in self.members.values():
            self.files.attach(agents[member.letter], member.letter)  # its container, and the job's secrets
            member.ctx = self._context(member)

    async def _ended_in_set_up(self, reason: str) -> JobResult:
        await self._emit(DeadlineEvent(reason=reason))
        errors = {"job": f"{reason}; raise coordination.timeout_s or retry when the machine is less busy"}
        self._result = JobResult(
            winner=None,
            consensus=False,
            reason=reason,
            failed=True,
            errors=errors,
            fallback=True,
            stopped_by=StopReason.DEADLINE,
        )
        await self.reports.finished(self._result)
        return self._result

    def steer(self, note: str) -> bool:
        """Hand a steering note to the running job; False once the job has ended (nothing reads it)."""
        try:
            self._send.send_nowait(Steer(note))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    def progress(self) -> Progress:
        """The live picture: each agent's state, answers and vote, the tally, the round (picture.py)."""
        return self.reports.progress()

    @property
    def checks(self) -> dict[str, Check]:
        return self.reports.checks

    # The loop ------------------------------------------------------------------------------------
    async def _handle(
        self, event: ProtocolEvent, tg: anyio.abc.TaskGroup, send: MemoryObjectSendStream[ProtocolEvent]
    ) -> None:
        letter = getattr(event, "letter", None)
        current = letter is None or self._in_turn(letter, getattr(event, "turn_id", -1))
        if not current:
            return  # a late event from a turn the protocol already cancelled
        posted = len(self.state.answers)
        actions = self.state.apply(event)
        await self._journal_event(event)
        await self._report(event, posted)
        await self._execute(actions, tg, send)

    async def _journal_event(self, event: ProtocolEvent) -> None:
        if self._journal is not None:
            await self._journal.append(event)

    def _replay(self, events: Sequence[ProtocolEvent]) -> list[Action]:
        """Feed the journal to the fresh protocol state; the actions still owed: the checks whose result
        was not reported (in flight, or come back as the process died), the turns in flight when the
        job's process died (the same ids, versions and labels), the presentation, the end."""
        starts: dict[int, StartTurn] = {}
        owed: list[Action] = []
        asked: list[str] = []  # answers whose check was asked for, in order
        for event in events:
            for action in self.state.apply(event):
                match action:
                    case StartTurn():
                        starts[action.turn_id] = action
                    case Present() | Finish():
                        owed.append(action)
                    case Verify():
                        asked.append(action.label)
                    case CancelTurn():
                        pass  # a cancelled turn is over
                    case _:
                        assert_never(action)
        # a result the protocol took but whose report was lost runs again for its report only (the
        # protocol counts a result once)
        checks: list[Action] = [Verify(label) for label in asked if label not in self.checks]
        finished: list[Action] = [a for a in owed if isinstance(a, Finish)]
        if finished:
            checks = []  # the job had ended: nothing would wait for them
        in_flight: list[Action] = [
            action
            for action in starts.values()
            if (turn := self.state.agents[action.letter].turn) is not None and turn.turn_id == action.turn_id
        ]
        presenting = self.state.phase == "presenting" and bool(owed) and isinstance(owed[-1], Present)
        ending: list[Action] = finished[-1:] if finished else (owed[-1:] if presenting else [])
        return checks + in_flight + ending

    def _in_turn(self, letter: str, turn_id: int) -> bool:
        turn = self.state.agents[letter].turn
        return turn is not None and turn.turn_id == turn_id

    async def _report(self, event: ProtocolEvent, posted: int) -> None:
        if len(self.state.answers) <= posted:
            await self.reports.event(event)
            return
        answer = self.state.answers[-1]  # an AnswerPosted, or a corrective turn's text taken as one
        await self.reports.answer(answer)
        try:
            await self.files.on_answer(answer.letter, answer.label)
        except ConclaveError as exc:  # e.g. a workspace over its caps: the answer stands, without files
            await self._emit(SnapshotFailedEvent(letter=answer.letter, label=answer.label, error=str(exc)))

    async def _execute(
        self, actions: list[Action], tg: anyio.abc.TaskGroup, send: MemoryObjectSendStream[ProtocolEvent]
    ) -> None:
        for action in actions:
            match action:
                case StartTurn():
                    scope = self._scopes[action.turn_id] = anyio.CancelScope()
                    await self._emit(
                        TurnStartedEvent(
                            letter=action.letter,
                            turn_id=action.turn_id,
                            round=action.version,
                            note=action.note,
                            corrective=action.corrective,
                        )
                    )
                    tg.start_soon(self._turn, action, scope, send.clone())
                case CancelTurn():
                    self._scopes.pop(action.turn_id, anyio.CancelScope()).cancel()
                    await self._emit(TurnCancelledEvent(letter=action.letter, turn_id=action.turn_id))
                case Verify():
                    self.checks[action.label] = Check(status="running")
                    await self._emit(CheckStartedEvent(letter=action.label[0], label=action.label))
                    tg.start_soon(self._verify, action.label, send.clone())
                case Present():
                    self.members[action.letter].presenting = True
                    await self._emit(PresentingEvent(letter=action.letter, winner=action.outcome.winner))
                    tg.start_soon(self._present, action, send.clone())
                case Finish():
                    await self._finish(action)
                case _:
                    assert_never(action)

    async def _finish(self, action: Finish) -> None:
        outcome = action.outcome
        for member in self.members.values():
            member.presenting = False
        try:
            await self.files.finish(outcome.winner)
        except ConclaveError as exc:
            await self._emit(SnapshotFailedEvent(label=outcome.winner, error=str(exc)))
        self._result = self.reports.result(action)
        await self.reports.finished(self._result)

    # Tasks ---------------------------------------------------------------------------------------
    async def _turn(
        self, action: StartTurn, scope: anyio.CancelScope, send: MemoryObjectSendStream[ProtocolEvent]
    ) -> None:
        member = self.members[action.letter]
        assert member.agent is not None and member.ctx is not None

        async def on_work(call: ToolCall) -> None:
            if call.name != CLI_WORK:  # a CLI's stale work run is cancelled, killing it (cli_turns.py)
                await send.send(WorkStarted(action.letter, action.turn_id))
            await self._emit(ToolCallEvent(letter=action.letter, name=call.name, arguments=call.arguments))

        ctx = replace(member.ctx, on_work=on_work)
        async with send:
            with scope:
                try:
                    if member.limit.reason is not None:  # reached between turns: no call starts
                        event: ProtocolEvent = TurnFailed(
                            action.letter, action.turn_id, member.limit.reason, fatal=True
                        )
                    else:
                        picture = self.files.picture(action.letter)
                        decided = await member.agent.turn(ctx, action, self._shown(action.labels), picture)
                        event = answers.read_decision(action, self.task, decided)
                except (ProviderError, TimeoutError) as exc:  # retries are spent: the agent is out
                    event = TurnFailed(action.letter, action.turn_id, _describe(exc), fatal=True)
                except Exception as exc:  # anything else fails this turn only, never the job
                    logger.warning("agent %s's turn failed", action.letter, exc_info=True)
                    error = f"the turn failed with {type(exc).__name__}: {exc}"
                    event = TurnFailed(action.letter, action.turn_id, error)
                if isinstance(event, TurnFailed) and event.refused:
                    await self._emit(AnswerRefusedEvent(letter=action.letter, error=event.error))
                await send.send(event)
            self._scopes.pop(action.turn_id, None)

    def _drop(self, member: Member) -> None:
        """The member reached its own token limit: its turn in flight ends now, for good (the protocol's
        fatal TurnFailed, ahead of anything the cancelled turn might still send). A charge between
        turns (a killed run's last) leaves it to its next turn, which fails before it calls anything."""
        turn = self.state.agents[member.letter].turn
        if turn is None or member.limit.reason is None:
            return
        self._scopes.pop(turn.turn_id, anyio.CancelScope()).cancel()
        self._send.send_nowait(TurnFailed(member.letter, turn.turn_id, member.limit.reason, fatal=True))

    async def _present(self, action: Present, send: MemoryObjectSendStream[ProtocolEvent]) -> None:
        member = self.members[action.letter]
        assert member.agent is not None and member.ctx is not None
        winner = self.state.answer(action.outcome.winner or "")
        assert winner is not None
        async with send:
            try:
                task = prompts.with_notes(prompts.task_section(self.task, self.history), self.state.notes)
                text = await member.agent.present(member.ctx, task, self._shown(), action.outcome)
                why = answers.presentation_problem(text, winner.content, self.task)
                await send.send(PresentationFailed(why) if why else Presented(text))
            except (ProviderError, TimeoutError) as exc:
                await send.send(PresentationFailed(_describe(exc)))
            except Exception as exc:  # a bug in presenting: the winning answer stands as it is
                logger.warning("the presentation failed", exc_info=True)
                await send.send(PresentationFailed(f"{type(exc).__name__}: {exc}"))

    async def _verify(self, label: str, send: MemoryObjectSendStream[ProtocolEvent]) -> None:
        assert self.verifier is not None
        async with send:
            run = await self.verifier.run(label)
            await self._report_blocked()
            self.reports.runs[label] = run
            await send.send(Verified(label, run.check.passed))

    async def _warm_checks(self, count: int) -> None:
        """Start the check containers and the caller's files' run (verification.py); then, if that run
        shows the command cannot run on the caller's files, say so at once, not with the vote's end."""
        assert self.verifier is not None
        await self.verifier.warm(count)
        await self._report_blocked()

    async def _report_blocked(self) -> None:
        """Report, once, why the check command cannot run on the caller's files (blocked_runs.py)."""
        blocked = self.verifier.blocked if self.verifier is not None else None
        if blocked is not None and self.reports.verify_blocked is None:
            self.reports.verify_blocked = blocked
            await self._emit(VerifyBlockedEvent(reason=blocked))

    async def _deadline(self, send: MemoryObjectSendStream[ProtocolEvent], deadline: float) -> None:
        async with send:
            await anyio.sleep_until(deadline)
            await send.send(
                Deadline(f"the job reached its timeout of {self.team.coordination.timeout_s:g} s")
            )

    # Helpers -------------------------------------------------------------------------------------
    def _context(self, member: Member) -> TurnContext:
        spec = member.spec
        limiter = self._limiters.of(spec.provider)
        rules = self.team.coordination
        system = prompts.system_prompt(
            self.task,
            member.letter,
            len(self.members),
            rules.max_answers_per_agent,
            spec.tool_mode,
            spec.system_prompt,
            verify=self.verifier is not None,
            history=self.history,
        )

        async def on_usage(usage: Usage, first: bool) -> None:
            charged = member.charge(usage, first)
            self.budget.charge(sum((m.spent() for m in self.members.values()), Usage()))
            charge = UsageEvent(letter=member.letter, model=spec.model, charge=charged, total=member.usage)
            await self._emit(charge)
            if member.limit.reached(member.spent()):  # after the report: the drop cancels this very turn
                self._drop(member)

        async def no_work(call: ToolCall) -> None:
            raise AssertionError("work tools are bound per turn")

        tools = self.files.tools(member.letter)
        return TurnContext(
            spec=spec,
            letter=member.letter,
            system=system,
            retry=self._retry,
            task=prompts.task_section(self.task, self.history) if self.history else self.task,
            limiter=limiter,
            on_usage=on_usage,
            in_flight=member.in_flight,
            on_work=no_work,
            max_tool_steps=rules.max_tool_steps,
            work_tools=tools.specs() if tools else (),
            handlers=tools.handlers() if tools else {},
            gate=self.budget.gate,
            # synchronous, from what is charged so far: a CLI's proxy asks it before each call
            stopped=lambda: self.budget.reason or member.limit.reason or member.limit.over(member.spent()),
        )

    def _shown(self, order: tuple[str, ...] = ()) -> list[ShownAnswer]:
        return picture.shown(self.state, self.checks, order)

    async def _emit(self, event: JobEvent) -> None:
        await self.reports.emit(event)


def _pending(receive: MemoryObjectReceiveStream[ProtocolEvent]) -> ProtocolEvent | None:
    try:
        return receive.receive_nowait()
    except anyio.WouldBlock:
        return None


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ProviderError) else "the provider call timed out"
