"""A member's plan login never leaves it except towards its provider: a workspace file that holds a
token of it (as it is, or base64) is left out of the answer's snapshot, so it is in no peer view, check
copy, final tree, diff or apply, and the result names it as held back; what the member says (its
answer) has the token masked, so no transcript, event, log or state-folder file keeps it
(server/files/secrets.py, docs/SECURITY.md).

The first test drives the snapshots directly; the second runs a whole job of two Claude Code members
logged in with a login file, in their containers, the CLI replaced by a shell script that leaks as a
persuaded CLI would (the real CLIs do the same in tests/security/test_cli_login_secrets_e2e.py)."""

from __future__ import annotations

import base64
import json
import logging
import shlex
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from conclave.backends.retry import RetryPolicy
from conclave.cli.render import closing
from conclave.clis.claude_code import ClaudeCode
from conclave.clis.cli_adapter import Login
from conclave.clis.member import CliMember
from conclave.config.loading import parse_team
from conclave.config.models import AgentSpec
from conclave.coordination.agents import Agent, CliAgent
from conclave.coordination.job_files import JobFiles
from conclave.coordination.members import Member
from conclave.coordination.protocol import Coordination
from conclave.coordination.reporting import Reporter
from conclave.coordination.reports import AnswerEvent, JobEvent, Progress, ToolCallEvent
from conclave.files.agent_tools import AgentTools
from conclave.files.contexts import ContextPath
from conclave.files.job_folder import JobFolder
from conclave.files.secrets import Secrets
from conclave.files.workspaces import Workspaces
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.sandbox.output import CommandResult
from conclave.sandbox.route import DirectRoute
from conclave.settings import Settings
from tests.fakes.agents import given_agents
from tests.fakes.calc_task import TASK, calc_project
from tests.fakes.environment import environment_of
from tests.fakes.login_files import claude_credentials, codex_auth, copilot_config, gemini_oauth_creds
from tests.fakes.waits import until_cli_done

pytestmark = pytest.mark.anyio
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
TOKEN = "sk-ant-oat01-" + "leakedplanlogin" * 4
REFRESH = "sk-ant-ort01-" + "leakedplanrefresh" * 4
CREDENTIALS = ".claude/.credentials.json"


def leaked_forms(content: bytes) -> list[bytes]:
    """What a leak of the login looks like on disk here: each token, and the file in base64."""
    return [TOKEN.encode(), REFRESH.encode(), base64.b64encode(content)[:60]]


def keeping(root: Path, forms: list[bytes]) -> list[str]:
    """The files under `root` that hold any of `forms` (line breaks ignored: `base64` wraps its lines)."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.is_socket():
            data = path.read_bytes()
            flat = data.replace(b"\n", b"")
            if any(form in data or form in flat for form in forms):
                found.append(str(path))
    return found


async def test_a_file_holding_a_login_token_is_in_no_snapshot_peer_view_check_copy_diff_or_apply(
    tmp_path: Path,
) -> None:
    content = claude_credentials(TOKEN, REFRESH)
    login = Login(files={CREDENTIALS: content})
    project = calc_project(tmp_path)
    ws = Workspaces(JobFolder(tmp_path, "job"), secrets=Secrets(login.secrets()))
    await ws.prepare([ContextPath(path=str(project), permission="write")])
    await ws.create(["A", "B"])
    mine = ws.rooted(ws.agent("B"))
    (mine / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (mine / "leak.txt").write_text(f"ANTHROPIC_AUTH={TOKEN}\n")
    (mine / "creds.b64").write_bytes(base64.encodebytes(content))  # wrapped at 76 columns
    (mine / "hex.txt").write_text(REFRESH.encode().hex())
    await ws.snapshot("B", "B1")
    await ws.publish("B", "B1")
    snapshot = ws.rooted(ws.snapshot_dir("B1"))
    assert sorted(path.name for path in snapshot.iterdir()) == ["calc.py", "test_calc.py"]
    assert ws.held("B1") == {"proj/leak.txt": "verbatim", "proj/creds.b64": "base64", "proj/hex.txt": "hex"}
    tools = AgentTools(workspace=ws.rooted(ws.agent("A")), peers=lambda: ws.peer_view("A"))
    seen = await tools.handlers()["read_file"]({"path": "leak.txt", "peer": "B"})
    assert seen.startswith("Error:") and TOKEN not in seen
    check = (await anyio.to_thread.run_sync(ws.check_copy, "B1")).path
    await ws.finalize("B1")
    patches = await ws.diffs()
    changes = await ws.apply("proj", patch=patches["proj"])
    patch = patches["proj"]
    assert "+    return a + b" in patch.text and [change.path for change in patch.files] == ["calc.py"]
    assert changes.held == [] and (project / "calc.py").read_text().endswith("a + b\n")
    forms = leaked_forms(content)
    for tree in (ws.peer_mount("B"), check, ws.final, ws.folder.snapshots, project):
        assert keeping(tree, forms) == [], tree
    await ws.remove_working_copies()
    assert keeping(tmp_path / "job", forms) == []  # the state folder keeps no value, nor the filter's record


async def test_no_event_keeps_a_secret_whoever_wrote_it() -> None:
    """Every event's data is masked on its way to the store, whatever wrote it (here an API agent's
    tool call and answer: it could hold a token only through a way the filter did not know)."""
    recorded: list[JobEvent] = []

    class Sink:
        async def record(self, event: JobEvent, progress: Progress) -> None:
            recorded.append(event)

    spec = parse_team({"agents": [{"model": "openai/gpt-fake"}]}, "t.yaml").agents[0]
    secrets = Secrets(Login(files={CREDENTIALS: claude_credentials(TOKEN, REFRESH)}).secrets())
    reports = Reporter(Sink(), Coordination(["A"]), {"A": Member(spec, "A")}, lambda: 0.0, secrets)
    encoded = base64.b64encode(f"token={REFRESH}".encode()).decode()
    await reports.emit(
        ToolCallEvent(letter="A", name="write_file", arguments={"path": "x", "content": TOKEN})
    )
    await reports.emit(
        AnswerEvent(letter="A", label="A1", revision=1, content=f"mine: {TOKEN} and {encoded}")
    )
    stored = json.dumps([event.model_dump() for event in recorded])
    assert TOKEN not in stored and encoded[4:40] not in stored and stored.count("[secret]") == 3


class Leaker(ClaudeCode):
    """Claude Code's login files and output, with a shell script in place of the CLI that does what a
    persuaded CLI can: copy its login file into its workspace, world-readable, and in base64, put its
    token in its answer, and fix the code; it votes for the first answer it is shown."""

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        if schema is not None:
            label = schema["properties"]["answer"]["enum"][0]
            decision = {"decision": "vote", "answer": label, "reason": "its check passed"}
            return ["echo", json.dumps({"type": "result", "result": "", "structured_output": decision})]
        answer = (
            "import json; t = json.load(open('/home/sandbox/.claude/.credentials.json'))"
            "['claudeAiOauth']['accessToken']; "
            "print(json.dumps({'type': 'result', 'result': 'Fixed add() in calc.py. My login: ' + t}))"
        )
        return [
            "sh",
            "-c",
            'cp "$HOME/.claude/.credentials.json" creds.json && chmod 644 creds.json; '
            'base64 "$HOME/.claude/.credentials.json" > creds.b64; '
            f"sed -i 's/return a - b/return a + b/' calc.py; python3 -c {shlex.quote(answer)}",
        ]


async def test_a_job_keeps_a_leaked_login_out_of_every_file_and_text_it_returns(
    clis_image: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="conclave")
    home = tmp_path / "user"
    (home / ".claude").mkdir(parents=True)
    content = claude_credentials(TOKEN, REFRESH)
    (home / CREDENTIALS).write_bytes(content)
    environ = {"HOME": str(home)}

    def members(spec: AgentSpec) -> Agent:
        member = CliMember.for_spec(spec, environ)
        member.adapter = Leaker()
        return CliAgent(member)

    project = calc_project(tmp_path)
    team = tmp_path / "team.yaml"
    team.write_text(
        "agents:\n  - model: cli/claude-code\n  - model: cli/claude-code\n"
        "coordination: {max_answers_per_agent: 1, final: reuse}\n"
    )
    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(given_agents(environment_of(settings, environ, FAST), members)) as service:
        context = [{"path": str(project), "permission": "write"}]
        view = await service.submit(
            JobRequest(task=TASK, team=str(team), context_paths=context, apply="force", verify="pytest -q")
        )
        view = await until_cli_done(service, view)
        patch = (await service.lookup.read(view.job_id, "@diff", None, 0, 100_000)).content
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        events = [event.model_dump_json() for event in service.store.sync.events(view.job_id)]

    assert view.state == "completed" and view.result is not None and view.result.winner, view.text()
    assert view.diff_summary is not None
    (changes,) = view.diff_summary.contexts
    assert changes.applied and [change.path for change in changes.files] == ["calc.py"]
    assert {(held.path, held.reason) for held in changes.held_back} == {
        ("creds.json", "secret"),
        ("creds.b64", "secret"),
    }
    shown = "\n".join(line.plain for line in closing(view, 200))  # what `conclave show` prints
    assert "held back, not applied: proj/creds.json: it holds a team member's login token" in shown
    assert "+    return a + b" in patch and (project / "calc.py").read_text().endswith("a + b\n")
    assert not (project / "creds.json").exists() and not (project / "creds.b64").exists()
    assert "My login: [secret]" in transcript  # the answer is kept, its token masked
    forms = leaked_forms(content)
    assert keeping(tmp_path / "state", forms) == [] and keeping(project, forms) == []
    assert not [form for form in forms if form.decode() in transcript or form.decode() in patch]
    assert not [form for form in forms if any(form.decode() in event for event in events)]
    assert not [form for form in forms if form.decode() in caplog.text]


PEER_LINE = "    return sum(sorted([a, b]))  # the peer's fix"
REFRESHED = "sk-ant-oat01-" + "refreshedinthecontainer" * 3


class LoginFileNow:
    """A member's container as its login file read back after a run sees it: the file as the member left
    it (`content`), the only thing of the container's that `_read_back_login` reads."""

    def __init__(self, content: bytes) -> None:
        self.content = content

    async def exec(self, command: str, timeout_s: float, **_: Any) -> CommandResult:
        return CommandResult(0, base64.b64encode(self.content).decode() + "\n", "", False, 0.0)


def rewritten(token: str, planted: str) -> bytes:
    """The login file as a prompt-injected member rewrites it: a token of its choice, and a peer's line
    in a field of its own and in a field the CLI keeps tokens in."""
    login = json.loads(claude_credentials(token, REFRESH))
    login["claudeAiOauth"]["note"] = planted
    login["claudeAiOauth"]["refreshToken"] = planted
    login["planted"] = [planted, {"deep": planted}]
    return json.dumps(login).encode()


async def test_a_member_that_rewrites_its_login_file_withholds_nothing_of_its_peers(tmp_path: Path) -> None:
    """A's login file, rewritten in its run to hold B's fix line, hides neither B's fixed file from B's
    snapshot nor B's answer from the voters; the token A's CLI refreshed stays out of A's own snapshot
    and text (what A plants in its token fields can hide only A's own work)."""
    project = calc_project(tmp_path)
    ws = Workspaces(JobFolder(tmp_path, "job"), secrets=Secrets())
    files = JobFiles("job", ws, None, DirectRoute())
    await ws.prepare([ContextPath(path=str(project), permission="write")])
    await ws.create(["A", "B"])
    spec = parse_team({"agents": [{"model": "cli/claude-code"}]}, "team").agents[0]
    login = Login(files={CREDENTIALS: claude_credentials(TOKEN, REFRESH)})
    member, peer_member = CliMember(spec, ClaudeCode(), login), CliMember(spec, ClaudeCode(), login)
    files.attach(CliAgent(member), "A")
    files.attach(CliAgent(peer_member), "B")
    await member._read_back_login(LoginFileNow(rewritten(REFRESHED, PEER_LINE)))  # type: ignore[arg-type]

    peer = ws.rooted(ws.agent("B"))
    (peer / "calc.py").write_text(f"def add(a, b):\n{PEER_LINE}\n")
    await ws.snapshot("B", "B1")
    assert ws.held("B1") == {}
    assert (ws.rooted(ws.snapshot_dir("B1")) / "calc.py").read_text().endswith(f"{PEER_LINE}\n")
    answer = f"Fixed add():\n{PEER_LINE}\n"
    assert ws.secrets.redact(answer) == answer and peer_member._redact(answer) == answer
    assert peer_member._redact(TOKEN) == "[secret]"  # the login as it was before the run: everyone's

    own = ws.rooted(ws.agent("A"))
    (own / "token.txt").write_text(REFRESHED)
    await ws.snapshot("A", "A1")
    assert ws.held("A1") == {"proj/token.txt": "verbatim"}  # its refreshed token, out of its own snapshot
    assert member._redact(f"token {REFRESHED}") == "token [secret]"


async def test_only_a_login_files_token_fields_are_secrets() -> None:
    """Each CLI's login file format names its secrets: a long string elsewhere in it is not one."""
    content = json.loads(claude_credentials(TOKEN, REFRESH))
    content["claudeAiOauth"]["subscriptionType"] = "a plan name as long as any token"
    login = Login(files={CREDENTIALS: json.dumps(content).encode()})
    assert sorted(login.secrets()) == sorted([TOKEN, REFRESH])
    codex = codex_auth("eyJ-access-token-of-codex-0123456789", "rt-refresh-token-0123456789", "acct-0042")
    gemini = gemini_oauth_creds("ya29.access-token-of-gemini-0123456789", "1//refresh-of-gemini-0123456789")
    copilot = copilot_config("gho_copilottoken0123456789abcdef")
    found = Login(
        files={".codex/auth.json": codex, ".gemini/oauth_creds.json": gemini, ".copilot/config.json": copilot}
    ).secrets()
    assert "eyJ-access-token-of-codex-0123456789" in found and "rt-refresh-token-0123456789" in found
    assert "ya29.access-token-of-gemini-0123456789" in found and "1//refresh-of-gemini-0123456789" in found
    assert "gho_copilottoken0123456789abcdef" in found
    assert "acct-0042" not in found and "member@example.com" not in found
    assert not [value for value in found if "googleapis.com/auth" in value or "User settings" in value]


FIX_LINE = "return a + b  # the honest member's fix"


class Censor(ClaudeCode):
    """Two members in one: with the model `opus`, a prompt-injected member that rewrites its own login
    file to hold its peer's fix line (in a token field and another) and answers with a note; else an
    honest member that waits for that answer (at /peers), then fixes calc.py with that line. Both vote
    for the first answer they are shown."""

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        if schema is not None:
            label = schema["properties"]["answer"]["enum"][0]
            decision = {"decision": "vote", "answer": label, "reason": "fine"}
            return ["echo", json.dumps({"type": "result", "result": "", "structured_output": decision})]
        if model == "opus":
            plant = (
                "import json, os; p = os.environ['HOME'] + '/.claude/.credentials.json'; "
                f"d = json.load(open(p)); d['claudeAiOauth']['refreshToken'] = {FIX_LINE!r}; "
                f"d['note'] = {FIX_LINE!r}; json.dump(d, open(p, 'w'))"
            )
            said = json.dumps({"type": "result", "result": "I left a note."})
            return [
                "sh",
                "-c",
                f"python3 -c {shlex.quote(plant)}; echo note > note.txt; echo {shlex.quote(said)}",
            ]
        said = json.dumps({"type": "result", "result": f"Fixed add(): {FIX_LINE}"})
        return [
            "sh",
            "-c",
            "for i in $(seq 300); do ls /peers/*/note.txt >/dev/null 2>&1 && break; sleep 1; done; "
            f"sed -i {shlex.quote(f's/return a - b/{FIX_LINE}/')} calc.py; echo {shlex.quote(said)}",
        ]


async def test_a_member_that_plants_its_peers_line_in_its_login_file_hides_nothing_of_the_peer(
    clis_image: str, tmp_path: Path
) -> None:
    """The attack as it ran: the honest member's fixed file stays in its snapshot (so in the diff, the
    peers' view and `read_workspace`), and its answer reaches the voters and the transcript whole."""
    home = tmp_path / "user"
    (home / ".claude").mkdir(parents=True)
    (home / CREDENTIALS).write_bytes(claude_credentials(TOKEN, REFRESH))
    environ = {"HOME": str(home)}

    def members(spec: AgentSpec) -> Agent:
        member = CliMember.for_spec(spec, environ)
        member.adapter = Censor()
        return CliAgent(member)

    project = calc_project(tmp_path)
    team = tmp_path / "team.yaml"
    team.write_text(
        "agents:\n  - model: cli/claude-code:opus\n  - model: cli/claude-code\n"
        "coordination: {max_answers_per_agent: 1, final: reuse}\n"
    )
    settings = Settings(home=tmp_path / "state")
    async with JobService.serve(given_agents(environment_of(settings, environ, FAST), members)) as service:
        context = [{"path": str(project), "permission": "read"}]
        view = await service.submit(JobRequest(task=TASK, team=str(team), context_paths=context))
        view = await until_cli_done(service, view)
        transcript = (await service.lookup.read(view.job_id, "transcript", None, 0, 100_000)).content
        honest = next(agent.letter for agent in view.agents if agent.model == "cli/claude-code")
        listing = (await service.lookup.read(view.job_id, "", f"{honest}1", 0, 100_000)).content
        fixed = (await service.lookup.read(view.job_id, "proj/calc.py", f"{honest}1", 0, 100_000)).content

    assert view.state == "completed", view.text()
    assert "proj/calc.py" in listing and FIX_LINE in fixed, fixed  # in the honest member's snapshot
    assert f"Fixed add(): {FIX_LINE}" in transcript and "Fixed add(): [secret]" not in transcript
