"""The arguments of each work tool as a strict pydantic model, and their problems in words for a model.

A model's tool call is untrusted input: wrong types, lists where a string belongs, lone surrogates from a
JSON `\\ud800` escape, keys no tool takes. Each of these is a `ValidationError` here, which
agent_tools.py turns into a tool result the model can act on; none may fail the job.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

DEFAULT_COMMAND_TIMEOUT_S = 60
MAX_COMMAND_TIMEOUT_S = 600


def _utf8(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "holds a lone surrogate (an unpaired \\ud800-\\udfff escape): send valid UTF-8 text"
        ) from None
    return value


Text = Annotated[str, AfterValidator(_utf8)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListArgs(_Args):
    path: Text | None = None
    peer: Text | None = None


class ReadArgs(_Args):
    path: Text
    start_line: Annotated[int, Field(ge=1)] | None = None
    end_line: Annotated[int, Field(ge=1)] | None = None
    peer: Text | None = None


class WriteArgs(_Args):
    path: Text
    content: Text


class EditArgs(_Args):
    path: Text
    old_text: Annotated[Text, Field(min_length=1)]
    new_text: Text
    replace_all: bool = False


class SearchArgs(_Args):
    pattern: Annotated[Text, Field(min_length=1)]
    path: Text | None = None
    peer: Text | None = None


class CommandArgs(_Args):
    command: Annotated[Text, Field(min_length=1)]
    timeout_s: Annotated[float, Field(ge=1, le=MAX_COMMAND_TIMEOUT_S)] = DEFAULT_COMMAND_TIMEOUT_S


def parse(model: type[_Args], tool: str, arguments: object) -> Any:
    """`arguments` as `model`, or ValueError with one line per problem, naming each argument."""
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {tool} must be a JSON object, got {type(arguments).__name__}")
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise ValueError(describe(model, tool, exc)) from None


def describe(model: type[_Args], tool: str, exc: ValidationError) -> str:
    takes = ", ".join(model.model_fields)
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        name = ".".join(str(part) for part in error["loc"]) or "arguments"
        name = name.encode("utf-8", "replace").decode("utf-8")[:80]  # a key may hold a lone surrogate too
        if error["type"] == "extra_forbidden":
            problems.append(f"`{name}` is not an argument of {tool} (it takes: {takes})")
        elif error["type"] == "missing":
            problems.append(f"`{name}` is required")
        else:
            problems.append(f"`{name}` {error['msg'].removeprefix('Value error, ')}")
    return f"bad arguments for {tool}: " + "; ".join(problems)
