"""Edit JSON-with-comments files in place: set one value or add array items, keep every other byte.

VS Code, Cursor and Claude Code read their settings as JSONC (comments, trailing commas). The text
is parsed with its comments and trailing commas blanked out to spaces, so offsets do not move: a
value's span in the blanked text is its span in the original. An edit replaces that span, or inserts
a member after the object's last one, and leaves comments, order and layout elsewhere as they were.
What an edit rewrites (the value it sets, comments inside it included) is written as plain JSON.
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# the stdlib's own JSON string scanner (typeshed leaves it out): (decoded text, index after the quote)
scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_SPACE = re.compile(r"\s*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}


class JsoncError(ValueError):
    """The text is not JSON with comments, or a path runs into something that is not an object."""


@dataclass
class Node:
    """A value and where it is: `start:end` in the text; members (with their key's offset) or items."""

    start: int
    end: int
    value: Any
    members: dict[str, tuple[int, Node]] = field(default_factory=dict)
    items: list[Node] = field(default_factory=list)


def loads(text: str) -> Any:
    """The value of a JSONC text; an empty text is an empty object."""
    return _root(text).value if text.strip() else {}


def set_value(text: str, path: Sequence[str], value: Any) -> str:
    """`text` with the member at `path` set to `value` (created with its parents if missing)."""
    if not text.strip():
        return json.dumps(_nest(path, value), indent=2, ensure_ascii=False) + "\n"
    node = _root(text)
    for depth, key in enumerate(path[:-1]):
        found = node.members.get(key)
        if found is None:
            return _insert_member(text, node, key, _nest(path[depth + 1 :], value))
        node = _object(found[1], path[: depth + 1])
    found = node.members.get(path[-1])
    if found is None:
        return _insert_member(text, node, path[-1], value)
    key_at, old = found
    return text[: old.start] + _dump(value, _indent(text, key_at)) + text[old.end :]


def add_items(text: str, path: Sequence[str], items: Sequence[Any]) -> str:
    """`text` with each of `items` not yet in the array at `path` appended to it (created if missing)."""
    node = _root(text) if text.strip() else None
    for depth, key in enumerate(path):
        found = node.members.get(key) if node is not None else None
        if found is None:
            return set_value(text, path, list(items))
        node = found[1] if depth == len(path) - 1 else _object(found[1], path[: depth + 1])
    assert node is not None
    if not isinstance(node.value, list):
        raise JsoncError(f"{'.'.join(path)} is not an array")
    missing = [item for item in items if item not in node.value]
    if not missing:
        return text
    if node.items:
        after = node.items[-1].end
        if "\n" not in text[node.start : node.items[0].start]:  # written on one line: stay on it
            added = "".join(f", {json.dumps(item, ensure_ascii=False)}" for item in missing)
        else:
            indent = _indent(text, node.items[0].start)
            added = "".join(f",\n{indent}{_dump(item, indent)}" for item in missing)
        return text[:after] + added + text[after:]
    indent = _indent(text, node.start) + "  "
    body = ",".join(f"\n{indent}{_dump(item, indent)}" for item in missing)
    return text[: node.start + 1] + body + "\n" + _indent(text, node.start) + text[node.end - 1 :]


# Inserting ------------------------------------------------------------------------------------------
def _insert_member(text: str, node: Node, key: str, value: Any) -> str:
    """`"key": value` added as the object's last member, indented like its siblings."""
    if node.members:
        key_at, last = max(node.members.values(), key=lambda member: member[1].end)
        if "\n" not in text[node.start : key_at]:  # written on one line: stay on it
            entry = json.dumps({key: value}, ensure_ascii=False)[1:-1]
            return text[: last.end] + f", {entry}" + text[last.end :]
        indent = _indent(text, key_at)
        entry = f"{json.dumps(key, ensure_ascii=False)}: {_dump(value, indent)}"
        return text[: last.end] + f",\n{indent}{entry}" + text[last.end :]
    outer = _indent(text, node.start)
    indent = outer + "  "
    entry = f"{json.dumps(key, ensure_ascii=False)}: {_dump(value, indent)}"
    inner = text[node.start + 1 : node.end - 1]
    keep = inner if inner.strip() else ""  # comments in an empty object stay, after the new member
    return text[: node.start + 1] + f"\n{indent}{entry}{keep}\n{outer}" + text[node.end - 1 :]


def _dump(value: Any, indent: str) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n" + indent)


def _indent(text: str, at: int) -> str:
    """The leading white space of the line holding offset `at`."""
    line = text[text.rfind("\n", 0, at) + 1 :]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _nest(path: Sequence[str], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def _object(node: Node, path: Sequence[str]) -> Node:
    if not isinstance(node.value, dict):
        raise JsoncError(f"{'.'.join(path)} is not an object")
    return node


# Parsing ---------------------------------------------------------------------------------------------
def _root(text: str) -> Node:
    blanked = blank(text)
    node = _value(blanked, _skip(blanked, 0))
    if _skip(blanked, node.end) != len(blanked):
        raise _error(blanked, node.end, "unexpected text after the value")
    if not isinstance(node.value, dict):
        raise JsoncError("the file does not hold a JSON object")
    return node


def blank(text: str) -> str:
    """`text` with comments and trailing commas turned to spaces (newlines kept), so offsets match."""
    out, i, n = list(text), 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i = _string_end(text, i)
            continue
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise _error(text, i, "a /* comment is not closed")
            end += 2
        elif c == ",":
            j = i + 1
            while j < n and (text[j].isspace() or text.startswith(("//", "/*"), j)):
                j = _string_end(text, j) if text[j] == '"' else j + 1
            if j < n and text[j] in "}]":
                out[i] = " "
            i += 1
            continue
        else:
            i += 1
            continue
        for k in range(i, end):
            if out[k] != "\n":
                out[k] = " "
        i = end
    return "".join(out)


def _string_end(text: str, i: int) -> int:
    try:
        return scanstring(text, i + 1)[1]
    except ValueError as exc:
        raise _error(text, i, "a string is not closed") from exc


def _skip(s: str, i: int) -> int:
    match = _SPACE.match(s, i)
    return match.end() if match else i


def _value(s: str, i: int) -> Node:
    if i >= len(s):
        raise _error(s, i, "a value is missing")
    c = s[i]
    if c == "{":
        return _members(s, i)
    if c == "[":
        return _items(s, i)
    if c == '"':
        text, end = scanstring(s, i + 1)
        return Node(i, end, text)
    for word, literal in _LITERALS.items():
        if s.startswith(word, i):
            return Node(i, i + len(word), literal)
    number = _NUMBER.match(s, i)
    if number:
        return Node(i, number.end(), json.loads(number.group()))
    raise _error(s, i, f"unexpected {c!r}")


def _members(s: str, start: int) -> Node:
    node, i = Node(start, start, {}), _skip(s, start + 1)
    while s[i : i + 1] != "}":
        if s[i : i + 1] != '"':
            raise _error(s, i, "expected a member name in double quotes")
        key_at = i
        key, i = scanstring(s, i + 1)
        i = _skip(s, i)
        if s[i : i + 1] != ":":
            raise _error(s, i, "expected ':'")
        child = _value(s, _skip(s, i + 1))
        node.members[key] = (key_at, child)
        node.value[key] = child.value
        i = _after_member(s, child.end, "}")
    node.end = i + 1
    return node


def _items(s: str, start: int) -> Node:
    node, i = Node(start, start, []), _skip(s, start + 1)
    while s[i : i + 1] != "]":
        child = _value(s, i)
        node.items.append(child)
        node.value.append(child.value)
        i = _after_member(s, child.end, "]")
    node.end = i + 1
    return node


def _after_member(s: str, i: int, close: str) -> int:
    """Past the comma after an object member or array item; at `close` when there is none."""
    i = _skip(s, i)
    if s[i : i + 1] == ",":
        return _skip(s, i + 1)
    if s[i : i + 1] != close:
        raise _error(s, i, f"expected ',' or '{close}'")
    return i


def _error(s: str, i: int, what: str) -> JsoncError:
    line = s.count("\n", 0, i) + 1
    column = i - (s.rfind("\n", 0, i) + 1) + 1
    return JsoncError(f"{what} at line {line} column {column}")
