"""The backend seam: one request shape in, a stream of normalized events out.

A backend knows its provider's SDK and wire format and nothing of the protocol. It maps every SDK
exception to `conclave.errors.ProviderError` subclasses (`raise ... from exc`), so callers never see
SDK classes. Retries live in `retry.py`, not here: SDK-level retries are switched off.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import ConfigDict

from conclave.config.models import Price

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call; `parameters` is a JSON schema object."""

    name: str
    description: str
    parameters: JsonObject


@dataclass(frozen=True)
class ToolCall:
    """A call the model made. Also a stream event.

    When the provider's arguments are not a JSON object, `arguments` is empty, `error` says why and
    `raw_arguments` keeps what came, so the caller can tell the model what to fix.
    """

    id: str
    name: str
    arguments: JsonObject = field(default_factory=dict)
    raw_arguments: str = ""
    error: str | None = None


@dataclass(frozen=True)
class Message:
    """One conversation entry. `tool` messages answer the call named by `tool_call_id`."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None  # Gemini matches function responses by name


@dataclass(frozen=True)
class Request:
    """Everything one model call needs.

    `system` is the stable prefix of a job (role, rules, task): backends that support prompt caching
    mark it cacheable. With `response_schema` set (the `json` decision mode) the reply must be one JSON
    object matching it, sent as text; `tools` is then ignored.
    """

    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: Literal["auto", "required"] = "auto"
    response_schema: JsonObject | None = None
    temperature: float | None = None
    max_tokens: int = 4096
    seed: int | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str


USAGE_SCHEMA = (
    "Tokens and US dollars. `input_tokens` counts every input token, `cached_input_tokens` the prompt-cache"
    " reads among them (billed cheaper). `cost_usd` is null when no agent's tokens have a cost (no price,"
    " and no CLI reported one); `uncosted_tokens` counts the tokens that came without a cost, so a cost"
    " beside them is only a lower bound (partial). `calls`: provider calls charged (a call that reported"
    " nothing, because its turn was cancelled or its worker died before its answer, is charged an estimate"
    " of its input). `estimated_input_tokens`: how many of `input_tokens` are such an estimate, not a"
    " provider's figure (their cost, when priced, is in `cost_usd` too)."
)


@dataclass(frozen=True)
class Usage:
    """Tokens and, when known, what they cost: one provider report, a member's charges or a job's total.

    `input_tokens` includes `cached_input_tokens`, the prompt-cache reads, however the provider said them:
    OpenAI's `cached_tokens` and Gemini's `cachedContentTokenCount` are part of its prompt tokens;
    Anthropic's cache reads and writes are beside its `input_tokens`, and its backend adds them in (the
    writes count as plain input). A call may report in several events (Anthropic and
    Gemini streams send the input side first): the call's usage is their sum, and each is counted as it
    arrives, so a call cut off midway still counts what its provider said it billed. `calls`: the provider
    attempts counted in (0 in a report).

    The cost: `cost_usd` is None when no part of the sum has a cost (no price, and no CLI said one);
    else the sum of the parts' costs, and `uncosted_tokens` counts the tokens of the parts that came
    without one, so the cost is a lower bound (`cost_partial`). A part without a cost never wipes
    what the others cost. Sums and differences are exact: a CLI run's final charge, which carries the
    whole run's cost, takes its earlier uncosted charges back (clis/meter.py).

    `estimated_input_tokens`: how many of `input_tokens` are an estimate (`estimated_input`), charged for
    a call whose provider has said nothing yet: the turn's provisional charge (coordination/
    turn_context.py), which the provider's first report takes back, so it stays only for a call that
    never reported (cancelled, or its worker died). Part of `input_tokens`, so budgets count it.
    """

    # as read back from the store and shown in a job's view (its schema's words)
    __pydantic_config__ = ConfigDict(extra="forbid", json_schema_extra={"description": USAGE_SCHEMA})

    calls: int = field(default=0, kw_only=True)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float | None = field(default=None, kw_only=True)
    # with a cost: the tokens it does not cover (without one: all of them)
    uncosted_tokens: int = field(default=0, kw_only=True)
    # of input_tokens, those estimated from a prompt rather than reported by a provider
    estimated_input_tokens: int = field(default=0, kw_only=True)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost_partial(self) -> bool:
        """A cost is known, but some tokens came without one: the cost is at least `cost_usd`."""
        return self.cost_usd is not None and self.uncosted_tokens > 0

    def _uncosted(self) -> int:
        return self.uncosted_tokens if self.cost_usd is not None else self.tokens

    def __add__(self, other: Usage) -> Usage:
        known = self.cost_usd is not None or other.cost_usd is not None
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            cost_usd=(self.cost_usd or 0.0) + (other.cost_usd or 0.0) if known else None,
            uncosted_tokens=self._uncosted() + other._uncosted() if known else 0,
            calls=self.calls + other.calls,
            estimated_input_tokens=self.estimated_input_tokens + other.estimated_input_tokens,
        )

    def __neg__(self) -> Usage:
        return Usage(
            -self.input_tokens,
            -self.output_tokens,
            -self.cached_input_tokens,
            cost_usd=None if self.cost_usd is None else -self.cost_usd,
            uncosted_tokens=-self.uncosted_tokens if self.cost_usd is not None else 0,
            calls=-self.calls,
            estimated_input_tokens=-self.estimated_input_tokens,
        )

    def __sub__(self, other: Usage) -> Usage:
        return self + -other

    @property
    def estimated(self) -> bool:
        """Some of these tokens are an estimate (a call that reported nothing), not a provider's figure."""
        return self.estimated_input_tokens != 0

    @property
    def nothing(self) -> bool:
        """No tokens, no call and no cost: a charge not worth sending."""
        return self.tokens == 0 and self.calls == 0 and not self.cost_usd and self.uncosted_tokens == 0

    def costing(self, cost_usd: float | None) -> Usage:
        """These tokens at the cost their provider or CLI reported, all of them covered by it."""
        return self if cost_usd is None else replace(self, cost_usd=cost_usd, uncosted_tokens=0)

    def priced(self, price: Price | None) -> Usage:
        """With a cost: its own (a CLI's report wins), else these tokens at `price` (US dollars per
        million), else none: an agent without a price has no cost, never a guessed one."""
        if self.cost_usd is not None or price is None:
            return self
        cached = price.input if price.cached_input is None else price.cached_input
        fresh = self.input_tokens - self.cached_input_tokens
        spent = fresh * price.input + self.cached_input_tokens * cached + self.output_tokens * price.output
        return replace(self, cost_usd=spent / 1e6, uncosted_tokens=0)


# what a provider adds around each message and tool definition, and around the whole prompt, in tokens
# (OpenAI's guide counts 3-4 a message; tool definitions are rendered into the prompt with more)
MESSAGE_FRAMING, TOOL_FRAMING, PROMPT_FRAMING = 4, 8, 8


def estimated_input(request: Request) -> int:
    """A call's input tokens as a provider probably billed them, for a call that reported nothing: four
    characters a token over all it sends (system prompt, messages, tools, as JSON), and the framing a
    provider adds around each message and tool. Near the bill, not exact: the usage says it is an
    estimate."""
    sent = len(json.dumps(asdict(request), ensure_ascii=False)) // 4
    framing = MESSAGE_FRAMING * (len(request.messages) + 1) + TOOL_FRAMING * len(request.tools)
    return sent + framing + PROMPT_FRAMING


@dataclass(frozen=True)
class Done:
    stop_reason: str


StreamEvent = TextDelta | ToolCall | Usage | Done


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where and how to reach one model. `api_key` never leaves the backend. Built by keyword only: its
    fields are an agent's (coordination/members.py `endpoint_of` fills them from its `AgentSpec`)."""

    provider: str
    model: str
    api_key: str = field(repr=False)
    base_url: str | None = None
    timeout_s: float = 120.0
    stream: bool = True
    model_path: str | None = None  # `local` only: the GGUF file (None: the bundled model)


def redact(text: str, secret: str, limit: int | None = None) -> str:
    """A provider's text fit for our messages: never the key (real keys are long; a short test value
    would mangle words), and, with `limit`, never a whole HTML page."""
    if len(secret) >= 8:
        text = text.replace(secret, "[api key]")
    return text if limit is None or len(text) <= limit else text[:limit] + "..."


@runtime_checkable
class Backend(Protocol):
    """A provider adapter. `stream` yields TextDelta/ToolCall and Usage events (Usage may come early, in
    parts that sum to the call's usage), then Done."""

    provider: ClassVar[str]

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Scorer(Protocol):
    """A backend that can also say how likely its model finds given replies (the `local` one).

    `score` returns, per candidate, the mean log-probability per token the model gives that text as
    its reply to `request` (its system prompt and messages): a vote by the model's own likelihood.
    """

    async def score(self, request: Request, candidates: list[str]) -> tuple[list[float], Usage]: ...


class ScoringBackend(Backend, Scorer, Protocol):
    """A backend that is also a `Scorer`: what a split-turn agent votes with (coordination/agents.py)."""
