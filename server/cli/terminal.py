"""Text for a terminal: model-written text cannot drive it (no escape sequences, no control characters).

A model's answer, a provider's error or a check's output may hold ANSI/VT sequences that retitle the
window, rewrite earlier lines, hide text, or (in some terminals) write files or run commands (OSC 52,
DCS). Every CLI renderer passes what it prints through `printable`.
"""

from __future__ import annotations

import re

# ESC sequences: CSI (ESC [ ... final), OSC/DCS/SOS/PM/APC strings (up to BEL or ST), and two-byte
# escapes; their 8-bit C1 forms too (0x9B CSI, 0x9D OSC, 0x90 DCS, ...).
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # other escapes (charset, keypad, reset)
)
# What is left of C0 and C1 but newline and tab, DEL, and the bidirectional overrides that reorder
# what a reader sees ("Trojan Source").
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without terminal escape sequences and control characters (newlines and tabs kept; a
    carriage return, which would let a line overwrite itself, is dropped)."""
    return _CONTROL.sub("", _SEQUENCE.sub("", text))
