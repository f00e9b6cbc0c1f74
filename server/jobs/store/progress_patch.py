"""What changed in a job's progress since it was last stored, as JSON paths to set in place (SQLite's
`json_set`, PostgreSQL's `jsonb_set`: jobs/store/dialect.py).

A running job reports its whole progress with every event, but most events (usage, tool calls) change
one agent's counters or nothing: the store writes only those parts.
"""

from __future__ import annotations

import json
from typing import Any

from conclave.jobs.store.dialect import ProgressPatch


def progress_patch(old: dict[str, Any], new: dict[str, Any]) -> ProgressPatch | None:
    """The parts of `new` that differ from `old`; None when the shape changed and the whole must be
    written."""
    if old.keys() != new.keys():
        return None
    patch: ProgressPatch = []
    for key, value in new.items():
        before = old[key]
        if value == before:
            continue
        if (
            key == "agents"
            and isinstance(value, list)
            and isinstance(before, list)
            and len(value) == len(before)
        ):
            patch += _agents(before, value)
        else:
            patch.append((f"$.{key}", json.dumps(value)))
    return patch


def _agents(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> ProgressPatch:
    patch: ProgressPatch = []
    for index, (before, agent) in enumerate(zip(old, new, strict=True)):
        if before.keys() != agent.keys():
            patch.append((f"$.agents[{index}]", json.dumps(agent)))
            continue
        patch += [
            (f"$.agents[{index}].{field}", json.dumps(value))
            for field, value in agent.items()
            if value != before[field]
        ]
    return patch
