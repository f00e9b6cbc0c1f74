"""The real Docker API client, keeping the command of every exec it is asked to create (the sandbox
tests count the execs a command costs:
tests/test_sandbox_command_runner.py, tests/test_sandbox_reaping.py)."""

from __future__ import annotations

import os
from typing import Any

from conclave.sandbox.container import Sandbox
from conclave.sandbox.engine import Owner, connect


class CountingApi:
    """The real docker API client, keeping each exec's command."""

    def __init__(self, api: Any) -> None:
        self._api, self.commands = api, list[Any]()

    def exec_create(self, container: str, cmd: Any, **options: Any) -> Any:
        self.commands.append(cmd)
        return self._api.exec_create(container, cmd, **options)

    @property
    def execs(self) -> int:
        return len(self.commands)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def counting_sandbox(kind: type[Sandbox]) -> tuple[Sandbox, CountingApi]:
    """A `kind` of sandbox (not started) on a client whose execs are counted."""
    client = connect()
    api = CountingApi(client.api)
    client.api = api
    return kind(client, Owner("test-" + os.urandom(4).hex())), api
