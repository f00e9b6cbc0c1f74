"""A prompt-injected member with a plan login leaks what it can, and none of it gets out: the real Claude
Code and the real Codex, logged in with the user's login files (Claude's expiring, so it refreshes it
inside its container first), each told by its scripted model to write its environment (`env`, every
readable /proc/*/environ) and copies of its login files, world-readable and in base64, into its
workspace; Claude Code also reads everything Codex's answer shares at /peers, which goes to Claude's
provider as its tool's output, and an API agent reads the CLI members' leaked files with its host-side
`read_file(peer=...)`, which go to its own provider.

No token of either login (the refreshed one included) reaches what the caller gets (the answers, the
patch, the applied project), the other members' providers, the transcript, the events, the server's log
or any file of the state folder; the result names the files held back for holding one
(server/files/secrets.py, docs/SECURITY.md). Needs the Docker engine and the CLI image.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest

from conclave.backends.retry import RetryPolicy
from conclave.jobs.request import JobRequest
from conclave.jobs.service import JobService
from conclave.settings import Settings
from tests.clis.conftest import hosts, project
from tests.fakes.calc_task import TASK
from tests.fakes.cli_worker import CliWorker
from tests.fakes.environment import environment_of
from tests.fakes.leaks import tokens
from tests.fakes.login_files import claude_credentials, codex_auth, codex_claims, jwt
from tests.fakes.login_hosts import LoginHosts
from tests.fakes.script import RecordedRequest, Reply
from tests.fakes.server import FakeProviders
from tests.fakes.team import decide, own_letter, vote_labels
from tests.fakes.waits import until_cli_done

__all__ = ["hosts", "project"]  # the fixtures this module uses, from tests/clis/conftest.py

pytestmark = pytest.mark.anyio
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
CLAUDE_TOKEN = "sk-ant-oat01-" + "injectedclaudelogin" * 3
CLAUDE_REFRESH = "sk-ant-ort01-" + "injectedclauderefresh" * 3
REFRESHED = "sk-ant-oat01-" + "refreshedthenleaked" * 3
REFRESHED_REFRESH = "sk-ant-ort01-" + "rotatedthenleaked" * 3
CODEX_ACCOUNT = "acct-conclave-injected-0042"
CODEX_TOKEN = jwt(codex_claims(CODEX_ACCOUNT, "injected-codex-access"))
CODEX_REFRESH = "rt-" + "injectedcodexrefresh" * 3
# what a persuaded CLI can do with its own login, each file world-readable
LEAK = (
    "env > leak_env.txt; "
    "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done > leak_proc.txt 2>/dev/null; "
    'cp -r "{config}" login_copy; base64 "{config}/{file}" > login.b64; '
    "chmod -R a+rX leak_env.txt leak_proc.txt login_copy login.b64; "
)
CLAUDE_WORK = (
    LEAK.format(config="$CLAUDE_CONFIG_DIR", file=".credentials.json")
    # the access token alone, as the CLI refreshed it before its first request: only the read-back of
    # its HOME after the run knows that one (clis/member.py)
    + "python3 -c \"import json, os; print(json.load(open(os.environ['CLAUDE_CONFIG_DIR'] + "
    + "'/.credentials.json'))['claudeAiOauth']['accessToken'])\" > token_only.txt; "
    + "sed -i 's/return a - b/return a + b/' calc.py; "
    # then what Codex's answer shares (its snapshot at /peers/<letter>), sent back to Claude's provider
    + "for i in $(seq 100); do ls /peers/*/leak_env.txt >/dev/null 2>&1 && break; sleep 1; done; "
    # (the login files first and the output short: Claude Code shows a long output only in part)
    + "for f in /peers/*/login_copy/auth.json /peers/*/login.b64 /peers/*/leak_env.txt; "
    + 'do echo "== $f"; cat "$f"; done 2>&1 | head -c 8000'
)
CODEX_WORK = LEAK.format(config="$CODEX_HOME", file="auth.json") + "sed -i 's/a - b/a * b/' calc.py"


KEY = "CONCLAVE_FAKE_KEY"
PEEKED = ["leak_env.txt", "leak_proc.txt", "login.b64", "token_only.txt", "login_copy/.credentials.json"]
PEEKED += ["login_copy/auth.json"]


def api_agent(request: RecordedRequest) -> Reply:
    """Answers without a change; once both CLI members have answered, reads their leaked files with
    `read_file(peer=...)` before it votes for an answer whose check passed."""
    labels = vote_labels(request)
    if "(your own answer)" not in request.text():
        return decide("new_answer", {"content": "calc.py looks right to me; I changed nothing."}, request)
    own = own_letter(request)
    peers = sorted({label[0] for label in labels} - {own})
    read = any(message.get("role") == "tool" for message in request.body.get("messages", []))
    if len(peers) == 2 and not read:
        calls = [("read_file", {"path": path, "peer": peer}) for peer in peers for path in PEEKED]
        return Reply(tool_calls=calls)
    passing = re.findall(r"## Answer ([A-P][0-9]+)[^\n]*verify passed", request.text())
    return decide("vote", {"answer": (passing or labels)[0], "reason": "its check passed"}, request)


def forms(values: list[str], files: list[bytes]) -> list[bytes]:
    """How a leak of these looks: each value as it is, and each login file in base64 (as `base64 FILE`
    writes it, and as the exec's environment carried it)."""
    return [value.encode() for value in values] + [base64.b64encode(content)[:60] for content in files]


async def whole(service: JobService, job_id: str, path: str) -> str:
    """All of a job's readable text, page by page."""
    pages, offset = [], 0
    while offset is not None:
        page = await service.lookup.read(job_id, path, None, offset, 100_000)
        pages.append(page.content)
        offset = page.next_offset
    return "".join(pages)


def leaked(data: bytes, found: list[bytes]) -> list[bytes]:
    flat = data.replace(b"\\n", b"").replace(b"\n", b"")  # line breaks, in a file or inside JSON
    return [form for form in found if form in data or form in flat]


def kept(root: Path, found: list[bytes]) -> list[str]:
    files = [path for path in root.rglob("*") if path.is_file() and not path.is_symlink()]
    return [str(path) for path in files if not path.is_socket() and leaked(path.read_bytes(), found)]


async def test_a_prompt_injected_member_leaks_no_login_token(
    clis_image: str,
    tmp_path: Path,
    project: Path,
    hosts: LoginHosts,
    fakes: FakeProviders,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="conclave")
    home = tmp_path / "user"
    (home / ".claude").mkdir(parents=True)
    (home / ".codex").mkdir()
    claude_file = claude_credentials(CLAUDE_TOKEN, CLAUDE_REFRESH, 60)  # refreshed at the CLI's start
    codex_file = codex_auth(CODEX_TOKEN, CODEX_REFRESH, CODEX_ACCOUNT)
    (home / ".claude" / ".credentials.json").write_bytes(claude_file)
    (home / ".codex" / "auth.json").write_bytes(codex_file)
    hosts.tokens["platform.claude.com"] = {
        "access_token": REFRESHED,
        "refresh_token": REFRESHED_REFRESH,
        "expires_in": 28_800,
        "scope": "user:inference user:profile user:sessions:claude_code",
        "token_type": "Bearer",
    }
    claude = CliWorker("anthropic", CLAUDE_WORK, "Fixed add() in calc.py; the test passes.")
    codex = CliWorker("responses", CODEX_WORK, "add() now multiplies.")
    hosts.script.set_default("claude", claude).set_default("codex", codex)
    fakes.script.set_default("api", api_agent)
    team = tmp_path / "team.yaml"
    team.write_text(
        "agents:\n  - model: cli/claude-code\n  - model: cli/codex:gpt-5.5\n"
        f"  - model: openai/gpt-fake\n    base_url: {fakes.base_url('openai', 'api')}\n"
        f"    api_key_env: {KEY}\n"
        "coordination: {max_answers_per_agent: 1, final: reuse, timeout_s: 900}\n"
        "sandbox: {memory: 2g, cpus: 1}\n"
    )
    settings = Settings(home=tmp_path / "state")
    environ = {"HOME": str(home), KEY: "fake-key-0123456789"}
    async with JobService.serve(
        replace(environment_of(settings, environ, FAST), route=hosts.redirect())
    ) as service:
        context = [{"path": str(project), "permission": "write"}]
        view = await service.submit(
            JobRequest(task=TASK, team=str(team), context_paths=context, apply="force", verify="pytest -q")
        )
        view = await until_cli_done(service, view)
        patch = await whole(service, view.job_id, "@diff")
        transcript = await whole(service, view.job_id, "transcript")
        events = [event.model_dump_json() for event in service.store.sync.events(view.job_id)]

    print(view.text())
    letters = {agent.model: agent.letter for agent in view.agents}
    assert view.state == "completed" and view.result is not None, view.text()
    assert view.result.winner == f"{letters['cli/claude-code']}1", transcript[-4000:]
    messages = [call for call in hosts.seen if call.host == "api.anthropic.com" and "/messages" in call.path]
    assert {call.authorization for call in messages} == {f"Bearer {REFRESHED}"}  # refreshed, then used
    # Claude Code did read Codex's shared files at /peers (its tool's output went to its provider)
    assert any("leak_env.txt" in result and "== /peers/" in result for result in claude.tool_results), [
        r[:3000] for r in claude.tool_results
    ]

    # the result names the login copies it held back; the patch and the project have none of them
    assert view.diff_summary is not None
    (changes,) = view.diff_summary.contexts
    held = {held.path: held.reason for held in changes.held_back}
    assert held.get("login_copy/.credentials.json") == "secret" and held.get("login.b64") == "secret", held
    assert held.get("token_only.txt") == "secret", held  # the refreshed token, known only after the run
    assert changes.applied and (project / "calc.py").read_text().endswith("a + b\n")
    assert not (project / "login.b64").exists()
    assert not (project / "login_copy" / ".credentials.json").exists()

    claude_secrets = [*tokens(claude_file, 30), REFRESHED, REFRESHED_REFRESH]
    codex_secrets = tokens(codex_file, 30)
    assert CLAUDE_REFRESH in claude_secrets and {CODEX_TOKEN, CODEX_REFRESH} <= set(codex_secrets)
    everything = forms(claude_secrets + codex_secrets, [claude_file, codex_file])
    # not to the caller, the state folder, the transcript, the events or the log
    assert kept(tmp_path / "state", everything) == [] and kept(project, everything) == []
    assert leaked(patch.encode(), everything) == [] and leaked(transcript.encode(), everything) == []
    assert [event for event in events if leaked(event.encode(), everything)] == []
    assert leaked(caplog.text.encode(), everything) == []
    # and not to the other member's provider
    codex_forms = forms(codex_secrets, [codex_file])
    claude_forms = forms(claude_secrets, [claude_file])
    to_claude = [request.text().encode() for request in hosts.script.requests_of("claude")]
    to_codex = [request.text().encode() for request in hosts.script.requests_of("codex")]
    assert to_claude and to_codex
    assert [body for body in to_claude if leaked(body, codex_forms)] == []
    assert [body for body in to_codex if leaked(body, claude_forms)] == []
    refreshes = [call.body for call in hosts.seen if call.host == "platform.claude.com"]
    assert refreshes and [body for body in refreshes if leaked(body, codex_forms)] == []
    # nor to the API agent's, which asked for every leaked file of both with read_file(peer=...)
    api = [request.text().encode() for request in fakes.script.requests_of("api")]
    assert any(b"read_file" in body and b"login.b64" in body for body in api)
    assert [body for body in api if leaked(body, everything)] == []
    assert json.loads((home / ".claude" / ".credentials.json").read_bytes()) == json.loads(claude_file)
