"""What every CLI module provides: the command line, the environment, the files of its private HOME,
and its JSON output read back into text, usage and cost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from conclave.backends.base import Usage
from conclave.config.clis import CliFacts, parse_settings, secret_fields
from conclave.sandbox.member import HOME  # a private tmpfs in the member's container
from conclave.sandbox.provider_wire import Wire

SCHEMA_FILE = f"{HOME}/decision-schema.json"
# A brief run's system prompt (a decision's or a presentation's: ours, in place of the CLI's own where it
# lets us), written by the member before each such run, like a decision's schema (member.py `script`).
SYSTEM_FILE = f"{HOME}/decision-system.md"
# What a key-mode CLI holds as its key inside its container: not a secret. Its egress proxy puts the real
# key in its place on the way to the provider (sandbox/provider_key.py).
PLACEHOLDER_KEY = "conclave-placeholder-the-egress-proxy-adds-the-key"


@dataclass(frozen=True)
class Login:
    """How the member logs in: a key (and the variable the CLI reads it from) or the user's login files
    (HOME-relative path -> content). Never printed: `repr` leaves the secrets out.

    `base_url` is the member's own endpoint (None: its CLI's official one). `bridge` is set only on the
    login as its container sees it (`held_by_proxy`): the URL the CLI sends its requests to; `key` is
    then the placeholder, and the member's egress proxy puts the real key in its place."""

    variable: str | None = None
    key: str | None = field(default=None, repr=False)
    files: dict[str, bytes] = field(default_factory=dict, repr=False)
    base_url: str | None = None
    bridge: str | None = None

    def held_by_proxy(self, bridge: str) -> Login:
        """This key login as its container sees it: the placeholder for its key, `bridge` as its URL."""
        return replace(self, key=PLACEHOLDER_KEY, bridge=bridge)

    def secrets(self) -> list[str]:
        """Every secret value of the login as the user's machine holds it: the key, and each login file's
        tokens (files/secrets.py keeps them out of the job's files and text). A file whose format gives
        no token is a secret whole: it is the user's, read before any run."""
        found = [self.key] if self.key else []
        for path, content in self.files.items():
            found += login_tokens(path, content) or [content.decode("utf-8", "replace").strip()]
        return found


def login_tokens(path: str, content: bytes) -> list[str]:
    """The tokens of login file `path` (HOME-relative) by its CLI's format: the strings under its
    secret fields (config/clis.py `secret_fields`), and nothing else of the file."""
    data = parse_settings(content)
    found: list[str] = []
    for fields in secret_fields(path):
        node: Any = data
        for name in fields:
            node = node.get(name) if isinstance(node, dict) else None
        stack = [node]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack += list(item.values())
            elif isinstance(item, list):
                stack += item
            elif isinstance(item, str):
                found.append(item)
    return found


@dataclass(frozen=True)
class CliOutput:
    """One CLI run read back: its final message, the usage it reported, its cost where it says, and the
    schema-constrained object where it gives one (`structured`)."""

    text: str
    usage: Usage = Usage()
    cost_usd: float | None = None
    structured: dict[str, Any] | None = None
    error: str | None = None  # the CLI said the run failed (e.g. Claude's is_error, Codex's turn.failed)


class CliAdapter(Protocol):
    """One coding-agent CLI, headless and in full-auto mode (the container is the boundary)."""

    facts: CliFacts
    native_schema: bool  # it constrains a reply to a JSON schema itself (else the prompt asks for JSON)
    # A winner presents with a brief run; False: its answer stands as it is (its brief run would still
    # carry a system prompt of its own far above a tenth of its work run's first request)
    presents: bool

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        """The argv (its binary first) of one headless run in /workspace. A `brief` run (a decision, with
        its reply's `schema`, or a presentation) is as small as the CLI allows: our system prompt
        (SYSTEM_FILE) in place of its own, no tools but a read-only one where the CLI has it
        (docs/subscriptions.md lists each CLI's flags and what it would not let us cut). A work run
        keeps the CLI's own prompt and the tools that can work in its container."""
        ...

    def wire(self, login: Login) -> Wire:
        """The API a key login's endpoint speaks: which calls its proxy lets through and how their
        responses say their usage (sandbox/provider_wire.py)."""
        ...

    def provider_url(self, login: Login) -> str | None:
        """Where this login's requests go when it is a key the container must never hold (its egress
        proxy adds it: member.py, sandbox/provider_key.py): its base_url, else the CLI's official API.
        None for a login the container holds: login files, OAuth and GitHub tokens."""
        ...

    def environment(self, login: Login, model: str | None) -> dict[str, str]:
        """Variables for the run: its config folder under HOME, quiet mode, the key and endpoint (for a
        key login, the placeholder and the bridge: `login.bridge`)."""
        ...

    def home_files(self, login: Login, model: str | None) -> dict[str, bytes]:
        """HOME-relative files written before the first run: the login files and the CLI's settings."""
        ...

    def parse(self, stdout: str) -> CliOutput:
        """The run's JSON output read back."""
        ...


def json_lines(stdout: str) -> Iterator[dict[str, Any]]:
    """Every JSON object line of a JSONL stream (other lines, e.g. warnings, are skipped)."""
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in `text` (a CLI's single result, or a decision written as JSON)."""
    decoder = json.JSONDecoder()
    found = None
    start = text.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            found = value
        start = text.find("{", start + end)
    return found
