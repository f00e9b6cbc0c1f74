"""The statistics bench/quality.py reports: a 95% interval for an accuracy, and a paired test.

Pure functions on counts, no dependencies (bench/ must run on the base install):
    wilson(correct, asked)            -> (low, high), the Wilson score interval at 95%
    mcnemar(a_ok, b_ok)               -> exact two-sided p-value that two modes answering the same
                                         questions are equally accurate (only the discordant pairs count)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959964


def wilson(correct: int, asked: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `correct` of `asked` (sound near 0 and 1, unlike p ± z·se)."""
    if asked == 0:
        return (0.0, 1.0)
    p = correct / asked
    centre = (p + z * z / (2 * asked)) / (1 + z * z / asked)
    half = z * math.sqrt(p * (1 - p) / asked + z * z / (4 * asked * asked)) / (1 + z * z / asked)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar(a_ok: Sequence[bool], b_ok: Sequence[bool]) -> dict[str, float | int]:
    """The exact McNemar test: of the questions exactly one mode got right, is the split 50/50?

    Returns the discordant counts (`a_only`, `b_only`) and the two-sided p-value."""
    if len(a_ok) != len(b_ok):
        raise ValueError(f"paired results differ in length: {len(a_ok)} and {len(b_ok)}")
    a_only = sum(1 for a, b in zip(a_ok, b_ok, strict=True) if a and not b)
    b_only = sum(1 for a, b in zip(a_ok, b_ok, strict=True) if b and not a)
    n, k = a_only + b_only, min(a_only, b_only)
    if n == 0:
        return {"a_only": 0, "b_only": 0, "p_value": 1.0}
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return {"a_only": a_only, "b_only": b_only, "p_value": round(min(1.0, 2 * tail), 4)}
