"""Scripted team members for the fake providers, and team files that point at them.

    with FakeProviders() as fakes:
        members = [("openai", "ann"), ("anthropic", "bob"), ("gemini", "cy")]
        team_file = write_team(tmp_path / "team.yaml", fakes, members)
        install(fakes.script, members, voter())
        ... JobService.serve(environment_of(settings, {KEY_ENV: "test-key"})) ...
        ... submit(JobRequest(task=task, team=str(team_file)))

A `voter` reads each request the way a model would: the presentation turn gets plain text, a turn
where the agent has no answer of its own yet gets `new_answer`, any other turn gets a `vote` for the
alphabetically first current label (or the preferred letter's), so every voter agrees; with
`by_position` it votes for the label shown first instead, as a model biased by position would. Labels
are anonymous letters shuffled per job, and each voter sees them in its own order, so they are read
from the request itself: the vote tool's `enum` (every wire format carries the JSON schema), else the
`## Answer B1` headings of the prompt. It works on OpenAI, Anthropic and Gemini bodies, native tool
calls and `json` tool mode alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.script import RecordedRequest, Reply, Script
from tests.fakes.server import FakeProviders

KEY_ENV = "CONCLAVE_FAKE_KEY"  # the variable every fake agent's key is read from (pass it in environ)
# The suite's user lets the fake key go to the fakes on this machine, whatever their port: a team file in
# a test's folder is a project's, not the user's own (config/destinations.py). tests/conftest.py sets it.
KEY_DESTINATION = f"{KEY_ENV}=127.0.0.1:*"
# The real providers' key variables and the fakes' (tests clear them: tests/conftest.py `isolated`).
PROVIDER_KEYS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OPENROUTER_API_KEY",
    KEY_ENV,
)
PRESENTATION = "You are the author of the answer your team voted best"
_HEADING = re.compile(r"## Answer ([A-Z][0-9]+)")
_OWN_LETTER = re.compile(r"You are agent ([A-Z])\b")

Responder = Callable[[RecordedRequest], Reply]


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def vote_labels(request: RecordedRequest) -> list[str]:
    """The labels the agent may vote for in this turn (empty when no answer exists yet)."""
    for node in _walk(request.body):
        properties = node.get("properties")
        if isinstance(properties, dict) and isinstance(properties.get("answer"), dict):
            enum = properties["answer"].get("enum")
            if enum:
                return [str(label) for label in enum]
    return list(dict.fromkeys(_HEADING.findall(request.text())))


def split_choices(request: RecordedRequest) -> list[str]:
    """The options of a split turn's decision (`turn: split`): labels in the voter's order, maybe `new`."""
    for node in _walk(request.body):
        properties = node.get("properties")
        if isinstance(properties, dict) and isinstance(properties.get("choice"), dict):
            return [str(option) for option in properties["choice"].get("enum", [])]
    return []


def offered(request: RecordedRequest) -> set[str]:
    """Names of the tools offered (native mode), or actions allowed by the decision schema (json mode)."""
    names = {str(node["name"]) for node in _walk(request.body) if isinstance(node.get("name"), str)}
    for node in _walk(request.body):
        properties = node.get("properties")
        action = properties.get("action") if isinstance(properties, dict) else None
        if isinstance(action, dict) and action.get("enum"):
            names |= {f"json:{name}" for name in action["enum"]}
    return names


def is_presentation(request: RecordedRequest) -> bool:
    return PRESENTATION in request.text()


def own_letter(request: RecordedRequest) -> str | None:
    found = _OWN_LETTER.search(request.text())
    return found.group(1) if found else None


def decide(name: str, arguments: dict[str, Any], request: RecordedRequest) -> Reply:
    """A workflow decision as a native tool call, or as the JSON text of `json` tool mode."""
    tools = offered(request)
    if name not in tools and f"json:{name}" in tools:
        return Reply(text=json.dumps({"action": name, **arguments}))
    return Reply(tool_calls=[(name, arguments)])


def voter(
    prefer: str | None = None,
    *,
    answer: Callable[[RecordedRequest], str] | None = None,
    final: Callable[[RecordedRequest], str] | None = None,
    delay: float = 0.0,
    by_position: bool = False,
) -> Responder:
    """A responder that answers once, then votes; `prefer` is a letter whose latest answer it favours.

    `answer` and `final` make the texts (defaults name the fake agent); `delay` slows every reply;
    `by_position` votes for whatever label is shown first.
    """

    def respond(request: RecordedRequest) -> Reply:
        if is_presentation(request):
            text = final(request) if final else f"FINAL: the team's answer, 42, presented by {request.agent}"
            return Reply(text=text, delay=delay)
        choices = split_choices(request)
        if choices:  # a split turn's decision: a label, as JSON
            labels = [option for option in choices if option != "new"]
            preferred = [label for label in labels if prefer and label.startswith(prefer)]
            choice = (preferred or (labels if by_position else sorted(labels)))[0]
            return Reply(text=json.dumps({"choice": choice}), delay=delay)
        labels = vote_labels(request)
        tools = offered(request)
        if not tools:  # a split turn's plain answer: no tools, no schema
            return Reply(text=answer(request) if answer else f"Answer from {request.agent}: 42.", delay=delay)
        can_answer = bool({"new_answer", "json:new_answer"} & tools)
        answered = "(your own answer)" in request.text()
        if can_answer and (not labels or not answered):
            content = answer(request) if answer else f"Answer from {request.agent}: 42."
            reply = decide("new_answer", {"content": content}, request)
        else:
            preferred = [label for label in labels if prefer and label.startswith(prefer)]
            choice = (preferred or (labels if by_position else sorted(labels)))[0]
            reply = decide("vote", {"answer": choice, "reason": f"{choice} is correct and complete"}, request)
        reply.delay = delay
        return reply

    return respond


def install(script: Script, members: Sequence[tuple[str, str]], responder: Responder) -> Script:
    """Make `responder` the default reply of every member's agent."""
    for _, agent in members:
        script.set_default(agent, responder)
    return script


def team_data(
    fakes: FakeProviders,
    members: Sequence[tuple[str, str]],
    *,
    name: str = "fake-team",
    key_env: str = KEY_ENV,
    coordination: Mapping[str, Any] | None = None,
    sandbox: Mapping[str, Any] | str = "none",
    **agent_options: Any,
) -> dict[str, Any]:
    """A team (as YAML data) whose agents are `(provider, agent name)` pairs served by `fakes`.

    `sandbox` is "none" (no commands, no Docker needed) unless a test asks for the Docker sandbox.
    """
    agents = [
        {
            "model": f"{provider}/fake-{agent}",
            "base_url": fakes.base_url(provider, agent),
            "api_key_env": key_env,
            **agent_options,
        }
        for provider, agent in members
    ]
    data: dict[str, Any] = {"name": name, "description": "fake providers", "agents": agents}
    data["sandbox"] = sandbox if isinstance(sandbox, str) else dict(sandbox)
    if coordination:
        data["coordination"] = dict(coordination)
    return data


def write_team(path: Path, fakes: FakeProviders, members: Sequence[tuple[str, str]], **options: Any) -> Path:
    """Write `team_data(...)` to `path` (give its str as ask_team's `team`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(team_data(fakes, members, **options), sort_keys=False), encoding="utf-8")
    return path


TRIO = (("openai", "ann"), ("anthropic", "bob"), ("gemini", "cy"))  # one agent per wire format
