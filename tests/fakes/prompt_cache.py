"""The fakes' prompt cache: cached input reported the way each provider reports it, when a request's
prefix repeats an earlier one's (on by `Script(prompt_cache=True)`; a scripted `Reply.usage` wins).

- OpenAI (Chat Completions and Responses) cache automatically: the longest prefix a prompt shares with an
  earlier one, from 1,024 tokens, in steps of 128; `cached_tokens` is part of the prompt tokens.
- Gemini caches implicitly, from 1,024 tokens; `cachedContentTokenCount` is part of `promptTokenCount`.
- Anthropic caches only up to a `cache_control` breakpoint: the longest breakpoint prefix written before
  is read (`cache_read_input_tokens`), the last one, when new and at least 1,024 tokens, is written
  (`cache_creation_input_tokens`); both are beside `input_tokens`, which counts only the rest.

A prompt is measured in the fakes' tokens (script.py `estimate_tokens`: four characters a token) over
its parts in the provider's cache order (tools, system, messages), per agent.
"""

from __future__ import annotations

import json
import threading
from typing import Any

MIN_TOKENS = 1024  # the shortest prefix OpenAI, Anthropic's Sonnet models and Gemini 2.5 Flash cache
OPENAI_STEP = 128


def _tokens(chars: int) -> int:
    return chars // 4


def _common(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (a binary search over slices)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _text(parts: Any) -> str:
    return json.dumps(parts, ensure_ascii=False)


class PromptCache:
    """What a provider's prompt cache holds, per agent; `enabled` false: nothing is ever cached."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._seen: dict[str, list[str]] = {}  # automatic caching: every earlier prompt
        self._written: dict[str, set[str]] = {}  # Anthropic: the breakpoint prefixes written

    def automatic(self, key: str, parts: list[Any], step: int = 1) -> int:
        """OpenAI and Gemini: the tokens this prompt shares with an earlier prompt of `key` (0 under
        MIN_TOKENS), rounded down to `step`."""
        if not self.enabled:
            return 0
        text = _text(parts)
        with self._lock:
            seen = self._seen.setdefault(key, [])
            best = max((_common(text, old) for old in seen), default=0)
            seen.append(text)
        tokens = _tokens(best)
        return 0 if tokens < MIN_TOKENS else tokens - tokens % step

    def breakpoints(self, key: str, body: dict[str, Any]) -> tuple[int, int]:
        """Anthropic: (read, written) tokens of a Messages request, by its `cache_control` breakpoints."""
        if not self.enabled:
            return 0, 0
        prefixes = _breakpoint_prefixes(body)
        with self._lock:
            written = self._written.setdefault(key, set())
            read = max((_tokens(len(p)) for p in prefixes if p in written), default=0)
            last = prefixes[-1] if prefixes else ""
            write = 0
            if last and last not in written and _tokens(len(last)) >= MIN_TOKENS:
                write = _tokens(len(last)) - read
            written.update(p for p in prefixes if _tokens(len(p)) >= MIN_TOKENS)
        return read, write


def _breakpoint_prefixes(body: dict[str, Any]) -> list[str]:
    """The request's blocks in cache order (tools, system, messages), as text up to each block marked
    `cache_control`; the marks themselves are left out of the text, as the API's cache key leaves them."""
    blocks: list[Any] = list(body.get("tools") or [])
    system = body.get("system")
    blocks += [{"type": "text", "text": system}] if isinstance(system, str) else list(system or [])
    for message in body.get("messages") or []:
        content = message.get("content")
        items = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        blocks += [{"role": message.get("role"), **item} for item in items]
    prefixes, text = [], ""
    for block in blocks:
        plain = {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block
        text += _text(plain)
        if isinstance(block, dict) and "cache_control" in block:
            prefixes.append(text)
    return prefixes
