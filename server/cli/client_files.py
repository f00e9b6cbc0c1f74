"""The clients' files, merged in place: JSON with comments (VS Code, Cursor, Claude Code) and Codex's TOML.

Each merge returns the new text, or the old text itself when nothing changes, and checks that the
result holds exactly what was meant with everything else as it was; when it cannot, it raises a
ConfigError carrying the snippet to write by hand.

Our own entry is replaced wholesale, never merged: a cloned repository's `.mcp.json` may already hold a
`conclave` entry whose `env` points the provider SDKs at its server (OPENAI_BASE_URL) or opens the sandbox's
network; `dropped` names what the replacement removes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conclave.cli import jsonc
from conclave.errors import ConfigError

NAME = "conclave"


def dropped(existing: Any, desired: Mapping[str, Any], where: str) -> list[str]:
    """What replacing `existing` with `desired` removes, as dotted keys (with the names a list or table
    held, never their values: an `env` may hold a key)."""
    if not isinstance(existing, Mapping):
        return []
    found: list[str] = []
    for key, value in existing.items():
        name, wanted = f"{where}.{key}", desired.get(key)
        if key not in desired:
            held = sorted(map(str, value)) if isinstance(value, (Mapping, list)) else []
            found.append(f"{name} ({', '.join(held)})" if held else name)
        elif isinstance(value, Mapping) and isinstance(wanted, Mapping):
            found += dropped(value, wanted, name)
        elif isinstance(value, list) and isinstance(wanted, list):
            gone = [str(item) for item in value if item not in wanted]
            found += [f"{name}: {', '.join(gone)}"] if gone else []
    return found


def existing_entry(text: str | None, path: Path, key: str) -> Any:
    """The `conclave` entry a JSON client file holds under `key` now (None: none)."""
    servers = _jsonc(text, path).get(key)
    return servers.get(NAME) if isinstance(servers, dict) else None


def existing_codex_table(text: str | None) -> Any:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        servers = tomlkit.parse(text or "").unwrap().get("mcp_servers")
    except TOMLKitError:
        return None  # merge_codex_toml says what is wrong
    return servers.get(NAME) if isinstance(servers, dict) else None


# JSON (with comments) ------------------------------------------------------------------------------
def _jsonc(text: str | None, path: Path) -> Any:
    try:
        return jsonc.loads(text or "")
    except jsonc.JsoncError as exc:
        raise ConfigError(
            f"{path} is not JSON (with comments) ({exc}): nothing was written; fix it first"
        ) from exc


def merge_json(text: str | None, path: Path, key: str, entry: dict[str, Any]) -> str:
    """`text` with `entry` as server `conclave` under `key`; `text` itself when nothing changes."""
    data = _jsonc(text, path)
    servers = data.get(key, {})
    if not isinstance(servers, dict) or not isinstance(servers.get(NAME, {}), dict):
        raise ConfigError(f"{path}: expected a JSON object with an object under {key!r}; fix the file")
    existing, merged = servers.get(NAME), entry
    if existing == merged and text is not None:
        return text
    after = jsonc.set_value(text or "", [key, NAME], merged)
    return _checked(path, after, {**data, key: {**servers, NAME: merged}})


def merge_settings(text: str | None, path: Path, lists: Mapping[tuple[str, ...], list[str]]) -> str:
    """Settings whose list at each path holds every item given for it; the user's items stay first."""
    data = _jsonc(text, path)
    after, expected = text or "", json.loads(json.dumps(data))
    for list_path, items in lists.items():
        try:
            after = jsonc.add_items(after, list_path, items)
        except jsonc.JsoncError as exc:
            raise ConfigError(f"{path}: {exc}; fix the file") from exc
        holder = expected
        for part in list_path[:-1]:
            holder = holder.setdefault(part, {})
        have = holder.setdefault(list_path[-1], [])
        have += [item for item in items if item not in have]
    return text if text is not None and after == text else _checked(path, after, expected)


def _checked(path: Path, after: str, expected: Any) -> str:
    """The safety net: the edited file holds exactly what was meant, everything else as it was."""
    try:
        ok = jsonc.loads(after) == expected
    except jsonc.JsoncError:
        ok = False
    if not ok:
        raise ConfigError(
            f"{path}: could not edit it in place; nothing was written. Add this by hand:\n"
            + json.dumps(expected, indent=2)
        )
    return after


# TOML ---------------------------------------------------------------------------------------------
def merge_codex_toml(text: str | None, path: Path, table: dict[str, Any]) -> str:
    """`text` with `[mcp_servers.conclave]` set to `table` merged over what is there; comments kept."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    text = text or ""
    try:
        document = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}): nothing was written; fix it first") from exc
    data = document.unwrap()
    servers = data.get("mcp_servers", {})
    existing = servers.get(NAME) if isinstance(servers, dict) else None
    merged = table
    if existing == merged:
        return text
    by_hand = (
        f"{path}: could not update mcp_servers.{NAME} in place (is it written inline?); nothing was "
        f"written. Replace it by hand with:\n{codex_snippet(merged)}"
    )
    try:
        if existing is None:
            for _ in range(
                0 if not text.strip() or text.endswith("\n\n") else 1 if text.endswith("\n") else 2
            ):
                document.add(tomlkit.nl())  # a blank line before our table
            if "mcp_servers" not in document:
                document["mcp_servers"] = tomlkit.table(is_super_table=True)
            document["mcp_servers"][NAME] = _toml_table(merged)
        else:
            trailing = _prune(document["mcp_servers"][NAME], merged)
            _update(document["mcp_servers"][NAME], merged)
            for item in trailing:  # the comments that followed a removed sub-table belong to what comes next
                document["mcp_servers"][NAME].add(item)
        after = tomlkit.dumps(document)
        ok = tomlkit.parse(after).unwrap() == {**data, "mcp_servers": {**servers, NAME: merged}}
    except (TOMLKitError, ValueError, TypeError):
        ok = False
    if not ok:  # the safety net: our table is what we meant, everything else as it was
        raise ConfigError(by_hand)
    return after


def _update(container: Any, values: Mapping[str, Any]) -> None:
    """Set `values` into an existing TOML table key by key, so its other keys and comments stay."""
    for key, value in values.items():
        if isinstance(value, Mapping) and isinstance(container.get(key), Mapping):
            _update(container[key], value)
        elif isinstance(value, Mapping):
            _add_dotted(container, [key], value)
        elif container.get(key) != value:
            container[key] = _toml_value(value)


def _prune(container: Any, values: Mapping[str, Any]) -> list[Any]:
    """Remove from an existing TOML table every key `values` does not hold (the entry is ours, wholesale);
    return the comments and blank lines that trailed a removed sub-table, to be put back."""
    import tomlkit.items

    trailing: list[Any] = []
    for key in list(container.keys()):
        if key not in values:
            item = container[key]
            if isinstance(item, tomlkit.items.Table):
                trivia = [value for name, value in item.value.body if name is None]
                while trivia and not isinstance(trivia[0], tomlkit.items.Comment):
                    trivia.pop(0)
                trailing = trivia + trailing
            del container[key]
        elif isinstance(values[key], Mapping) and isinstance(container[key], Mapping):
            trailing += _prune(container[key], values[key])
    return trailing


def _toml_table(values: Mapping[str, Any]) -> Any:
    """A standard table for `values`; nested values as dotted keys (`tools.ask_team.approval_mode`), which
    stay inside the table instead of trailing it as sub-tables after whatever comments follow it."""
    import tomlkit

    table = tomlkit.table()
    _update(table, values)
    return table


def _add_dotted(container: Any, prefix: list[str], values: Mapping[str, Any]) -> None:
    import tomlkit

    for key, value in values.items():
        if isinstance(value, Mapping):
            _add_dotted(container, [*prefix, key], value)
        else:
            container.add(tomlkit.key([*prefix, key]), _toml_value(value))


def _toml_value(value: Any) -> Any:
    """Lists one item a line when long, as people write them."""
    import tomlkit

    if isinstance(value, list) and len(json.dumps(value)) > 80:
        array = tomlkit.array()
        array.extend(value)
        return array.multiline(True)
    return value


def codex_snippet(table: Mapping[str, Any]) -> str:
    import tomlkit

    document = tomlkit.document()
    document["mcp_servers"] = tomlkit.table(is_super_table=True)
    document["mcp_servers"][NAME] = _toml_table(table)
    return tomlkit.dumps(document)
