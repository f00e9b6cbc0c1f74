"""Run a coding-agent CLI member headless in its agent's container: one `docker exec` per run.

    member = CliMember.for_spec(spec, environ)           # login resolved on the host, at job start
    member.bind(sandbox, egress={"HTTPS_PROXY": ...})    # its container, and its way out (the proxy)
    output = await member.run(prompt)                    # the work: edits /workspace, final message
    output = await member.run(prompt, schema, system=...) # the decision: a schema-constrained object,
                                                         # a brief run with our system prompt
    output = await member.run(prompt, system=...)         # a presentation: as brief, plain text

Each run is one exec, `sh -c` under coreutils `timeout -s KILL` (sandbox/container.py): it writes the
private HOME on the container's tmpfs (0700, only once: a CLI may refresh its token there), then runs
the CLI with stdin closed. A key never reaches the container: the member's egress proxy holds it (`bind`)
and adds it to the requests the CLI sends to the bridge, where the CLI holds a placeholder (the adapter's
`provider_url`, sandbox/provider_key.py). Login files reach the container only as the exec's environment,
which the prelude unsets before the CLI starts. A cancelled run (stale turn, cancelled job, budget) kills
every process of the member's user in the container at once (`Sandbox.kill_all`: `setsid` children too).

Every run's usage goes to `charge`. A key login's comes from its egress proxy, which reads each call's
usage from the provider's own response as it passes and refuses calls once `stopped` says a budget is
reached (sandbox/egress.py): what the CLI prints is not counted then, so nothing is counted twice. A
plan login's comes from the CLI's output as it reports it (meter.py: a budget can stop a long run),
however the run ends, a killed one's included (`CliMember.reported`).

Secrets: the member's login values join the job's set when it is bound (`secrets`, files/secrets.py:
every snapshot keeps them out), and after every run, however it ended, its login files are read back
from HOME and their tokens join too, since a CLI may refresh its login there. What a run gives back
(its text, its decision, its error) has every known value of the job replaced before anyone sees it.
It is also a `Backend` (one text reply from a brief run: the request's system prompt in place of the
CLI's own, no work tools), so a CLI member presents like any other, for about a decision's cost.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import json
import logging
import math
import shlex
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar

import anyio
import anyio.from_thread
from anyio.streams.memory import MemoryObjectReceiveStream

from conclave.backends.base import Done, Request, StreamEvent, TextDelta, Usage
from conclave.clis.claude_code import ClaudeCode
from conclave.clis.cli_adapter import SCHEMA_FILE, SYSTEM_FILE, CliAdapter, CliOutput, Login, login_tokens
from conclave.clis.codex import Codex
from conclave.clis.copilot import Copilot
from conclave.clis.gemini_cli import Gemini
from conclave.clis.logins import resolve_login
from conclave.clis.meter import Charge, Meter, ProxyCharges
from conclave.config.models import CliAgentSpec
from conclave.errors import ProviderError, SandboxError
from conclave.files.secrets import Secrets
from conclave.sandbox.container import Sandbox
from conclave.sandbox.egress import Stopped
from conclave.sandbox.member import HOME, MemberSandbox
from conclave.sandbox.output import CommandResult
from conclave.sandbox.provider_key import ProviderKey

ADAPTERS: dict[str, CliAdapter] = {
    "claude-code": ClaudeCode(),
    "codex": Codex(),
    "gemini": Gemini(),
    "copilot": Copilot(),
}
logger = logging.getLogger(__name__)
OUTPUT_CAP = 8 * 1024 * 1024  # a run's JSON output (Codex's stream carries every tool output)
METER_PAUSE_S = 0.25  # between two reads of a run's output for its usage so far
REPLY_SYSTEM = "Reply in plain text."  # a reply asked for with no system prompt of its own: still brief


@dataclass
class CliMember:
    """One CLI member of one job: its adapter, model and login, then its container once bound."""

    provider: ClassVar[str] = "cli"

    spec: CliAgentSpec
    adapter: CliAdapter
    login: Login = field(repr=False)
    model: str | None = None
    sandbox: Sandbox | None = None
    egress: dict[str, str] = field(default_factory=dict)
    runs: int = 0
    secrets: Secrets = field(default_factory=Secrets, repr=False)  # the job's, once bound
    # One run at a time, its kill included: a cancelled turn's kill (every process of the member's user)
    # must be over before the next turn's run starts, or it kills that run too.
    _one_run: anyio.Lock = field(default_factory=anyio.Lock, repr=False)

    def __post_init__(self) -> None:
        self.secrets.add(self.login.secrets())

    @classmethod
    def for_spec(cls, spec: CliAgentSpec, environ: Mapping[str, str]) -> CliMember:
        return cls(spec, ADAPTERS[spec.facts.name], resolve_login(spec, environ), spec.cli_model)

    def bind(
        self,
        sandbox: Sandbox | None,
        egress: Mapping[str, str] | None = None,
        *,
        secrets: Secrets | None = None,
    ) -> None:
        """Its container, the variables that point the CLI at its way out (the egress proxy the sandbox
        was started with, as `sandbox.egress_env`, when it has one), and the job's secrets, which its
        login's values join. A key login's key goes to the container's egress proxy, never into the
        container; SandboxError for a container without one. `secrets` is this member's (files/secrets.py
        `member`): the login's values join the job's, withheld from every member."""
        provider = self._provider()
        if provider is not None and sandbox is not None:
            if not isinstance(sandbox, MemberSandbox):
                raise SandboxError(
                    f"{self.spec.model} logs in with a key, which only its egress proxy may hold: it needs a "
                    "CLI member's sandbox (sandbox/member.py)"
                )
            sandbox.egress.serve_key(provider)
        self.sandbox = sandbox
        self.egress = dict(egress if egress is not None else getattr(sandbox, "egress_env", None) or {})
        if secrets is not None:
            secrets.job.add(self.login.secrets())
            self.secrets = secrets

    def _provider(self) -> ProviderKey | None:
        """Where the member's key login goes, with its key, through its egress proxy (None: no key login)."""
        url = self.adapter.provider_url(self.login)
        if url is None or not self.login.key:
            return None
        return ProviderKey(url, self.login.key, self.adapter.wire(self.login))

    @property
    def metered(self) -> bool:
        """Its egress proxy holds its key, so counts its calls' usage (the CLI's own report is not used)."""
        return self._provider() is not None and isinstance(self.sandbox, MemberSandbox)

    @property
    def inside(self) -> Login:
        """The login as the container gets it: a key login's placeholder and bridge, or its login files."""
        provider = self._provider()
        return self.login if provider is None else self.login.held_by_proxy(provider.bridge_url())

    async def run(
        self,
        prompt: str,
        schema: dict[str, Any] | None = None,
        charge: Charge | None = None,
        *,
        system: str = "",
        stopped: Stopped | None = None,
    ) -> CliOutput:
        """One headless run to its output; ProviderError when the CLI fails or prints nothing usable.
        With a `system` prompt it is a brief run (cli_adapter.py `command`): that prompt in place of the
        CLI's own where it takes ours, no work tools; a decision's also has its reply's `schema`.

        `charge` gets the run's usage while it runs, as its output reports it (meter.py: a job's budget
        can stop a long run), and its total however it ends: finished, past its timeout, or killed
        because its turn was cancelled (stale, the job cancelled, the budget reached), then the
        cancellation goes on. A killed run is charged what its stream reported before the kill.

        A key login's usage is its proxy's count instead (`metered`): `charge` hears each call's usage
        from the provider's response, and `stopped` (why no more calls may go: the member's budget or
        the job's) is asked before each call; a run without a `charge` (a presentation) keeps the last."""
        if self.sandbox is None:
            raise ProviderError(
                "cli",
                f"{self.spec.model} needs its sandbox: a CLI member runs only in a container "
                "(the team's `sandbox` must not be none, and the job needs Docker)",
            )
        command, env = self.script(prompt, schema, system)
        self.runs += 1
        results: list[CommandResult] = []
        meter: Meter | None = None
        proxied: ProxyCharges | None = None
        try:
            async with self._one_run:
                # the proxy's count once the previous run is over (a killed one's last attempts included)
                since = self._connections()
                if self.metered and charge is not None:
                    assert isinstance(self.sandbox, MemberSandbox)
                    proxied = ProxyCharges(charge)
                    self.sandbox.egress.meter_to(proxied, stopped or _never)
                elif charge is not None:
                    live = partial(self.streamed, prompt, since=since)
                    meter = Meter(live, partial(self.reported, prompt, since=since), charge, self.spec.price)
                try:
                    await self._exec(self.sandbox, command, env, results, meter)
                finally:  # in the lock: its exec's reaping must not meet the next run's
                    with anyio.CancelScope(shield=True):
                        await self._read_back_login(self.sandbox)
        finally:
            if meter is not None and results:  # a run killed before its exec started used nothing
                with anyio.CancelScope(shield=True):
                    await meter.update(results[0].stdout, final=True)
            if proxied is not None and results:
                with anyio.CancelScope(shield=True):
                    await proxied.close(self.adapter.parse(results[0].stdout).cost_usd, self.spec.price)
        result = results[0]
        output = self._redacted(self.adapter.parse(result.stdout))
        if result.timed_out:
            raise ProviderError(
                "cli", f"{self.spec.model} ran past its timeout_s of {self.spec.timeout_s:g} s and was killed"
            )
        if output.error is not None and not output.text and output.structured is None:
            detail = self._redact(f"{output.error} {result.stderr[-800:]}".strip())
            raise ProviderError("cli", f"{self.spec.model} failed (exit code {result.exit_code}): {detail}")
        return output

    def streamed(self, prompt: str, stdout: str, *, since: int | None = None) -> tuple[Usage, float | None]:
        """A run's usage so far, mid-run: Claude Code's per-response reports, else `reported`'s."""
        streamed = getattr(self.adapter, "streamed_usage", None)
        if streamed is not None:
            return streamed(stdout), None  # nothing yet until the first response starts: no estimate
        return self.reported(prompt, stdout, quiet=True, since=since)

    def reported(
        self, prompt: str, stdout: str, *, quiet: bool = False, since: int | None = None
    ) -> tuple[Usage, float | None]:
        """A run's usage and cost: its CLI's final report; for a run cut short, what its stream said
        before the kill (Claude Code's per-response usage); failing both (Codex, Gemini CLI and Copilot
        CLI report tokens only at the end, Copilot's only in a file), an estimate of four characters a
        token over the prompt (input) and the printed stream (output), which misses the CLI's own
        system prompt and tools: a lower bound (docs/subscriptions.md). No estimate for a run that never
        reached its provider: its egress proxy admitted no connection after `since` (its count when the
        run began), so no provider saw a request to bill, e.g. a CLI killed while still starting up; an
        estimate for one that did, though it printed nothing."""
        output = self.adapter.parse(stdout)
        if output.usage != Usage():
            return output.usage, output.cost_usd
        streamed = getattr(self.adapter, "streamed_usage", None)
        usage = streamed(stdout) if streamed is not None else Usage()
        if usage != Usage():
            return usage, None
        now = self._connections()
        reached = None if since is None or now is None else now > since
        if reached is False:
            return Usage(), None  # it never got through to its provider: nothing was billed
        if reached is None and not stdout.strip():
            return Usage(), None  # no proxy to ask, and killed before the CLI said anything
        # a connection went out: its request may be billed, though the CLI may have printed nothing yet
        if not quiet:
            logger.info("%s: no usage reported by the run; charging an estimate", self.spec.model)
        guessed = len(prompt) // 4 + 1  # marked: the usage says which input tokens are a guess
        return Usage(guessed, len(stdout) // 4, 0, estimated_input_tokens=guessed), None

    async def _exec(
        self,
        sandbox: Sandbox,
        command: str,
        env: dict[str, str],
        results: list[CommandResult],
        meter: Meter | None,
    ) -> None:
        """The exec, never abandoned: when the turn is cancelled, every process of the member's user is
        killed at once (`setsid` children too) and the exec is awaited to its end (its output, the
        usage so far, lands in `results`) before the cancellation goes on. An abandoned exec would
        reap after it ends, killing the next turn's run. Meanwhile the meter charges the output as it
        arrives."""
        send, receive = anyio.create_memory_object_stream[bytes](math.inf)

        def heard(chunk: bytes) -> None:  # in the exec's worker thread
            # once the run is over (or the loop is), its final charge reads the whole output
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, RuntimeError):
                anyio.from_thread.run_sync(send.send_nowait, chunk)

        async def execute() -> None:
            with anyio.CancelScope(shield=True):
                results.append(
                    await sandbox.exec(
                        command,
                        self.spec.timeout_s,
                        environment=env,
                        output_cap=OUTPUT_CAP,
                        on_stdout=heard if meter is not None else None,
                    )
                )
            group.cancel_scope.cancel()

        async def kill_when_cancelled() -> None:
            try:
                await anyio.sleep_forever()
            finally:
                if not results:  # cancelled from outside while the CLI runs
                    await sandbox.kill_all()

        async with send, receive, anyio.create_task_group() as group:
            group.start_soon(execute)
            group.start_soon(kill_when_cancelled)
            if meter is not None:
                group.start_soon(_charge_as_heard, meter, receive)

    def script(
        self, prompt: str, schema: dict[str, Any] | None, system: str = ""
    ) -> tuple[str, dict[str, str]]:
        """The exec's shell command and environment (tests read both; the login is only in `env`); a
        brief run (`system`) writes its system prompt to HOME first, a decision (`schema`) its schema."""
        login = self.inside
        env = {**self.egress, **self.adapter.environment(login, self.model), "HOME": HOME}
        lines = [f'umask 077; mkdir -p "{HOME}"']
        passed: list[str] = []
        for index, (path, content) in enumerate(sorted(self.adapter.home_files(login, self.model).items())):
            variable = f"CONCLAVE_HOME_FILE_{index}"
            target = shlex.quote(f"{HOME}/{path}")
            env[variable] = base64.b64encode(content).decode()
            passed.append(variable)
            lines.append(
                f'[ -e {target} ] || {{ mkdir -p "$(dirname {target})" && '
                f'printf %s "${variable}" | base64 -d > {target}; }} || exit 97'
            )
        if schema is not None:
            env["CONCLAVE_SCHEMA"] = json.dumps(schema)
            passed.append("CONCLAVE_SCHEMA")
            lines.append(f'printf %s "$CONCLAVE_SCHEMA" > {SCHEMA_FILE} || exit 97')
        if system:
            env["CONCLAVE_SYSTEM"] = system
            passed.append("CONCLAVE_SYSTEM")
            lines.append(f'printf %s "$CONCLAVE_SYSTEM" > {SYSTEM_FILE} || exit 97')
        if passed:
            lines.append(f"unset {' '.join(passed)}")
        lines.append("umask 022")  # what the CLI writes in /workspace, peers may read (files/peer_access.py)
        run = (
            f"{shlex.join(self.adapter.command(prompt, self.model, schema, bool(system), login))} </dev/null"
        )
        after = getattr(self.adapter, "after", None)
        lines.append(f"{run}; status=$?; {after}; exit $status" if after else f"exec {run}")
        return "\n".join(lines), env

    def _connections(self) -> int | None:
        """How many connections the member's egress proxy has admitted (None without one at hand)."""
        return self.sandbox.egress.admitted if isinstance(self.sandbox, MemberSandbox) else None

    async def _read_back_login(self, sandbox: Sandbox) -> None:
        """Add the tokens of the login files as they are now in HOME (a run may have refreshed them) to
        this member's own secrets: only its token fields (config/clis.py `secret_fields`), and withheld
        only from its own work. The member can rewrite these files, so what they hold now must not decide
        what is withheld from its peers (SECURITY.md)."""
        if not self.login.files:
            return
        paths = list(self.login.files)
        reads = [f"base64 -w0 {shlex.quote(f'{HOME}/{path}')} 2>/dev/null; echo" for path in paths]
        try:
            result = await sandbox.exec("; ".join(reads), 30, output_cap=OUTPUT_CAP)
        except SandboxError:
            logger.warning("%s: its login files could not be read back after a run", self.spec.model)
            return
        for path, line in zip(paths, result.stdout.splitlines(), strict=False):
            try:
                content = base64.b64decode(line.strip(), validate=True)
            except ValueError:
                continue  # not base64: not a file's content
            self.secrets.add(login_tokens(path, content))

    def _redacted(self, output: CliOutput) -> CliOutput:
        """The run's output with every known secret of the job replaced (files/secrets.py)."""
        structured = self.secrets.scrub(output.structured) if output.structured else None
        error = self._redact(output.error) if output.error is not None else None
        return replace(output, text=self._redact(output.text), structured=structured, error=error)

    def _redact(self, text: str) -> str:
        return self.secrets.redact(text)

    # The Backend seam: one reply from the CLI (a presentation) ----------------------------------------
    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        prompt = "\n\n".join(message.content for message in request.messages).strip()
        output = await self.run(prompt, system=request.system or REPLY_SYSTEM)
        yield TextDelta(output.text)
        # a metered member's calls were charged by its proxy as they went: its report here is none
        yield Usage() if self.metered else output.usage
        yield Done("end_turn")

    async def aclose(self) -> None:
        return None


def _never() -> str | None:
    return None


async def _charge_as_heard(meter: Meter, receive: MemoryObjectReceiveStream[bytes]) -> None:
    """Charge a run's output as it arrives: every chunk heard so far, read together, then a pause so a
    chatty stream is read a few times a second, not once a chunk (each read parses the whole output)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    stdout = ""
    async for chunk in receive:
        chunks = [chunk]
        while True:
            try:
                chunks.append(receive.receive_nowait())
            except anyio.WouldBlock:
                break
        if len(stdout) < OUTPUT_CAP:  # past it, the final charge reads the (capped) whole
            stdout += "".join(decoder.decode(part) for part in chunks)
        with anyio.CancelScope(shield=True):  # a charge is never cut half-way (its event written)
            await meter.update(stdout)
        await anyio.sleep(METER_PAUSE_S)
