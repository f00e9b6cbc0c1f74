"""An API agent's turn: build the prompt, call the model (with its work tools), turn the reply into a
decision; and any agent's presentation through its backend (agents.py holds the kinds of agent).

A turn returns a protocol event (AnswerPosted, VoteCast, NoDecision or TurnFailed); it never touches
the protocol state itself. Provider errors propagate as `ProviderError` for the orchestrator.
"""

from __future__ import annotations

import json
import re

from conclave.backends.base import Backend, Message, ToolCall
from conclave.backends.retry import Completion
from conclave.coordination import prompts
from conclave.coordination.protocol_events import (
    AnswerPosted,
    NoDecision,
    ProtocolEvent,
    StartTurn,
    TurnFailed,
    VoteCast,
)
from conclave.coordination.reports import ShownAnswer
from conclave.coordination.tally import Outcome
from conclave.coordination.turn_context import TurnContext
from conclave.files.agent_tools import tool_error

WORKFLOW = ("new_answer", "vote")
MIN_REPAIR_STEPS = 2  # malformed workflow calls get at least this many chances to be fixed


async def api_turn(
    ctx: TurnContext,
    backend: Backend,
    action: StartTurn,
    shown: list[ShownAnswer],
    files: prompts.FilesPicture | None = None,
) -> ProtocolEvent:
    """Run one turn to its decision: one call to `backend` ending in a decision (native tool calls, or
    JSON in `json` mode), after any work-tool calls."""
    text = prompts.turn_prompt(
        ctx.letter,
        shown,
        action.labels,
        action.can_answer,
        note=action.note,
        corrective=action.corrective,
        files=files,
        notes=action.notes,
    )
    if ctx.spec.tool_mode == "json" and ctx.work_tools:
        text = f"{prompts.tools_section(ctx.work_tools)}\n\n{text}"
    messages = [Message("user", text)]
    if ctx.spec.tool_mode == "json":
        return await _json_turn(ctx, backend, action, messages)
    return await _native_turn(ctx, backend, action, messages)


async def _native_turn(
    ctx: TurnContext, backend: Backend, action: StartTurn, messages: list[Message]
) -> ProtocolEvent:
    tools = prompts.workflow_tools(action.labels, action.can_answer) + ctx.work_tools
    work_steps = repairs = 0
    while True:
        # A corrective turn forces a tool call: the model already ended one turn with bare text.
        request = ctx.request(messages, tools=tools, tool_choice="required" if action.corrective else "auto")
        completion = await ctx.call(backend, request)
        if not completion.tool_calls:
            return NoDecision(ctx.letter, action.turn_id, completion.text)
        decision = next((call for call in completion.tool_calls if call.name in WORKFLOW), None)
        if decision is not None:
            event, problem = _decide(ctx.letter, action, decision)
            if event is not None:
                return event
            repairs += 1
            if repairs > max(MIN_REPAIR_STEPS, ctx.max_tool_steps):
                return TurnFailed(ctx.letter, action.turn_id, f"{decision.name}: {problem}")
            messages += _tool_round(completion, {decision.id: tool_error(problem)})
            continue
        work_steps += 1
        if work_steps > ctx.max_tool_steps:
            note = (
                f"you used all {ctx.max_tool_steps} tool steps of this turn; "
                "decide now with new_answer or vote"
            )
            if work_steps > ctx.max_tool_steps + MIN_REPAIR_STEPS:  # it ignores the note: a failed turn
                return TurnFailed(ctx.letter, action.turn_id, f"kept calling tools after: {note}")
            messages += _tool_round(completion, {call.id: tool_error(note) for call in completion.tool_calls})
            tools = prompts.workflow_tools(action.labels, action.can_answer)
            continue
        results = {call.id: await _work(ctx, call) for call in completion.tool_calls}
        messages += _tool_round(completion, results)


async def _work(ctx: TurnContext, call: ToolCall) -> str:
    if call.error:
        return tool_error(f"the arguments of {call.name} were not valid JSON ({call.error})")
    handler = ctx.handlers.get(call.name)
    if handler is None:
        valid = ", ".join([*WORKFLOW, *ctx.handlers])
        return tool_error(f"there is no tool named {call.name!r}; the tools are {valid}")
    await ctx.on_work(call)
    return await handler(call.arguments)


def _tool_round(completion: Completion, results: dict[str, str]) -> list[Message]:
    """The assistant's calls and one result per call, in the shape every backend maps."""
    replies = [
        Message(
            "tool",
            results.get(call.id, "not run: one decision per turn"),
            tool_call_id=call.id,
            tool_name=call.name,
        )
        for call in completion.tool_calls
    ]
    return [Message("assistant", completion.text, tool_calls=completion.tool_calls), *replies]


def _decide(letter: str, action: StartTurn, call: ToolCall) -> tuple[ProtocolEvent | None, str]:
    """A workflow call as a protocol event, or the problem to tell the model."""
    if call.error:
        return None, f"the arguments were not valid JSON ({call.error})"
    args = call.arguments
    if call.name == "new_answer":
        content = args.get("content")
        if not isinstance(content, str) or not content.strip():
            return None, "new_answer needs a non-empty string `content` with your complete answer"
        return AnswerPosted(letter, action.turn_id, content), ""
    label = args.get("answer")
    if not isinstance(label, str) or not label.strip():
        return None, f"vote needs `answer`: one of {', '.join(action.labels) or '(none yet)'}"
    reason = args.get("reason")
    return VoteCast(letter, action.turn_id, label.strip(), reason if isinstance(reason, str) else ""), ""


async def _json_turn(
    ctx: TurnContext, backend: Backend, action: StartTurn, messages: list[Message]
) -> ProtocolEvent:
    """Decisions and work-tool calls as schema-constrained JSON, one per reply."""
    names = tuple(tool.name for tool in ctx.work_tools)
    steps = 0
    while True:
        offered = names if steps < ctx.max_tool_steps else ()
        schema = prompts.decision_schema(action.labels, action.can_answer, offered)
        completion = await ctx.call(backend, ctx.request(messages, response_schema=schema))
        call = parse_json_tool_call(completion.text, offered)
        if call is None:
            return parse_json_decision(ctx.letter, action, completion.text)
        steps += 1
        result = await _work(ctx, call)
        messages += [
            Message("assistant", completion.text),
            Message("user", prompts.tool_result(call.name, result)),
        ]


def parse_json_tool_call(text: str, offered: tuple[str, ...]) -> ToolCall | None:
    """A `{"action": "call_tool", ...}` reply as a ToolCall; None for anything else (a decision)."""
    data = _load_json(text)
    if not isinstance(data, dict) or data.get("action") != "call_tool" or not offered:
        return None
    name, arguments = data.get("tool"), data.get("arguments")
    error = None if isinstance(arguments, dict) else "`arguments` must be a JSON object"
    return ToolCall("json", str(name), arguments if isinstance(arguments, dict) else {}, error=error)


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _load_json(text: str) -> object | None:
    """The JSON value of a reply (a ```json fence allowed); None when it is not JSON."""
    match = _FENCE.match(text)
    try:
        value: object = json.loads(match.group(1) if match else text)
    except json.JSONDecodeError:
        return None
    return value


def parse_json_decision(letter: str, action: StartTurn, text: str) -> ProtocolEvent:
    """A `json`-mode reply as a decision; anything unreadable is a NoDecision for the corrective retry."""
    data = _load_json(text)
    if data is None:
        return NoDecision(letter, action.turn_id, text)
    if isinstance(data, dict) and data.get("action") in WORKFLOW:
        call = ToolCall("json", str(data["action"]), {k: v for k, v in data.items() if k != "action"})
        event, _ = _decide(letter, action, call)
        if event is not None:
            return event
    content = data.get("content") if isinstance(data, dict) else None
    return NoDecision(letter, action.turn_id, content if isinstance(content, str) else text)


async def present(
    ctx: TurnContext, backend: Backend, task: str, shown: list[ShownAnswer], outcome: Outcome
) -> str:
    """The winner's presentation through `backend`: the final answer in plain text."""
    assert outcome.winner is not None
    messages = [Message("user", prompts.presentation_prompt(task, shown, outcome.tally, outcome.winner))]
    completion = await ctx.call(backend, ctx.request(messages, system=prompts.PRESENT_SYSTEM))
    return completion.text
