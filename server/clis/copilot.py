"""GitHub Copilot CLI: `copilot -p PROMPT --output-format json`, JSONL events; the final message is the
last `assistant.message`. Its stream carries no token counts: they come from `--usage-output-file`
(read back after the run, `modelMetrics.<m>.usage`). Cost is in premium requests, not dollars.

Full-auto is `--allow-all-tools`. Its built-in MCP servers (GitHub's, on the model host) are off: a
member works on its files, not on the user's repositories through their GitHub login. A custom endpoint
(`base_url`) is Copilot's own-key provider (COPILOT_PROVIDER_*, offline: no GitHub sign-in). No
schema-constrained output: JSON in the prompt.

Only the tools a run needs reach the model (`--available-tools`, 1.0.102): a work run its shell and
file tools. None gets the repository's custom instructions (`--no-custom-instructions`).

A brief run (a decision, a presentation) cannot be `-p`: prompt mode keeps Copilot's own system prompt,
about 9 kB, two fifths of a work run's first request. It goes through Copilot's server mode instead
(`copilot --headless --stdio`, the JSON-RPC its SDK speaks, github/copilot-sdk), driven by a small
script (`BRIEF_SESSION`) run with the container's python3: one session whose system message is ours
(`systemMessage` mode `replace`), with only `view` (to look at /peers), each of its read permissions
granted once. It prints the session's events in `-p`'s JSON shape, each call's `assistant.usage`
included, so the usage is read from the stream as it comes (`parse`).
"""

from __future__ import annotations

from typing import Any

from conclave.backends.base import Usage
from conclave.clis.cli_adapter import SYSTEM_FILE, CliOutput, Login, json_lines, last_json_object
from conclave.config.clis import CLIS
from conclave.sandbox.member import HOME
from conclave.sandbox.provider_wire import Wire

USAGE_FILE = f"{HOME}/copilot-usage.json"
USAGE_MARK = "@@conclave-copilot-usage@@"  # the member's run prints the usage file after this line
WORK_TOOLS = ("bash", "read_bash", "stop_bash", "view", "create", "edit", "grep", "glob")
DECISION_TOOLS = ("view",)

# Copilot CLI's server mode for a brief run: argv SYSTEM_FILE USAGE_FILE TOOLS MODEL PROMPT (TOOLS
# comma-separated, MODEL "" for the login's default); a key login's provider from the COPILOT_PROVIDER_*
# variables (server mode reads a provider only from its session). The messages are
# JSON-RPC 2.0 in Content-Length frames; a session's events come as `session.event` notifications, and
# a permission it asks for (`permission.requested`) is answered by a request of ours.
BRIEF_SESSION = r"""
import json, os, subprocess, sys, uuid
system_file, usage_file, tools, model, prompt = sys.argv[1:6]
with open(system_file, encoding="utf-8") as f:
    system = f.read()
try:
    os.remove(usage_file)  # a work run's report: this run's usage is in its stream
except FileNotFoundError:
    pass
copilot = subprocess.Popen(
    ["copilot", "--headless", "--stdio", "--no-auto-update", "--log-level", "none", "--disable-builtin-mcps",
     "--no-custom-instructions", "--disable-client-telemetry"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/workspace")
ids = iter(range(1, 1 << 30))

def write(message):
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    copilot.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    copilot.stdin.flush()

def send(method, params):
    number = next(ids)
    write({"id": number, "method": method, "params": params})
    return number

def receive():
    length = None
    while True:
        line = copilot.stdout.readline()
        if not line:
            fail("Copilot CLI's server ended the session (exit code %s)" % copilot.wait())
        if not line.strip():
            break
        name, _, value = line.decode().partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return json.loads(copilot.stdout.read(length))

def emit(kind, data):
    print(json.dumps({"type": kind, "data": data}), flush=True)

def fail(message):
    emit("session.error", {"message": message})
    sys.exit(1)

def handle(message):
    if "method" not in message:
        return False  # the answer to a permission we granted
    if "id" in message:  # a callback no session of ours asked for
        write({"id": message["id"], "error": {"code": -32601, "message": "not handled"}})
        return False
    event = (message.get("params") or {}).get("event") or {}
    kind, data = event.get("type"), event.get("data") or {}
    if kind == "permission.requested":  # view's reads (of /peers): the container is the boundary
        send("session.permissions.handlePendingPermissionRequest",
             {"sessionId": session, "requestId": data.get("requestId"), "result": {"kind": "approve-once"}})
    elif kind == "assistant.message":
        emit(kind, {"content": data.get("content") or ""})
    elif kind == "assistant.usage":
        keys = ("model", "inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")
        emit(kind, {key: data.get(key) for key in keys})
    elif kind == "session.error":
        emit(kind, {"message": data.get("message")})
    return kind in ("session.idle", "session.error")

def call(method, params):
    number = send(method, params)
    while True:
        message = receive()
        if message.get("id") == number and "method" not in message:
            if "error" in message:
                fail("%s: %s" % (method, (message["error"] or {}).get("message")))
            return message.get("result") or {}
        handle(message)

session = str(uuid.uuid4())
create = {"sessionId": session, "clientName": "conclave",
          "systemMessage": {"mode": "replace", "content": system}, "availableTools": tools.split(","),
          "workingDirectory": "/workspace", "requestPermission": True}
if model:
    create["model"] = model
if os.environ.get("COPILOT_PROVIDER_BASE_URL"):
    create["provider"] = {"type": os.environ.get("COPILOT_PROVIDER_TYPE", "openai"),
                          "baseUrl": os.environ["COPILOT_PROVIDER_BASE_URL"],
                          "apiKey": os.environ.get("COPILOT_PROVIDER_API_KEY", "")}
call("connect", {})
call("session.create", create)
call("session.send", {"sessionId": session, "prompt": prompt})
while not handle(receive()):
    pass
copilot.stdin.close()
try:
    copilot.wait(timeout=15)
except subprocess.TimeoutExpired:
    copilot.kill()
"""


class Copilot:
    facts = CLIS["copilot"]
    native_schema = False
    presents = True  # a brief run is our system prompt and `view` (see above)
    after = f'echo; echo "{USAGE_MARK}"; cat "{USAGE_FILE}" 2>/dev/null'  # run after the CLI, same exec

    def command(
        self, prompt: str, model: str | None, schema: dict[str, Any] | None, brief: bool, login: Login
    ) -> list[str]:
        if brief:
            tools = ",".join(DECISION_TOOLS)
            return ["python3", "-I", "-c", BRIEF_SESSION, SYSTEM_FILE, USAGE_FILE, tools, model or "", prompt]
        argv = [
            "copilot",
            "-p",
            prompt,
            "--allow-all-tools",
            "--output-format",
            "json",
            "--no-auto-update",
            "--disable-client-telemetry",
            "--disable-builtin-mcps",  # its GitHub MCP server would act on the user's GitHub with the token
            "--usage-output-file",
            USAGE_FILE,
            "-C",
            "/workspace",
            "--no-custom-instructions",
        ]
        argv += ["--model", model] if model else []
        return [*argv, "--available-tools", *WORK_TOOLS]

    def wire(self, login: Login) -> Wire:
        """Its own-key provider's API: Anthropic's for an endpoint that says so, else OpenAI's."""
        return "anthropic" if login.base_url and "anthropic" in login.base_url else "openai"

    def provider_url(self, login: Login) -> str | None:
        """Only its own-key provider (a base_url): a GitHub token is a plan login."""
        return login.base_url if login.key and login.base_url else None

    def environment(self, login: Login, model: str | None) -> dict[str, str]:
        env = {"COPILOT_HOME": f"{HOME}/.copilot", "COPILOT_AUTO_UPDATE": "false"}
        if login.base_url:
            env |= {
                "COPILOT_PROVIDER_BASE_URL": login.bridge or login.base_url,
                "COPILOT_OFFLINE": "true",
                "COPILOT_PROVIDER_TYPE": self.wire(login),
            }
            if login.key:
                env["COPILOT_PROVIDER_API_KEY"] = login.key
            if model:
                env["COPILOT_MODEL"] = model
        elif login.key:
            env["COPILOT_GITHUB_TOKEN"] = login.key
        return env

    def home_files(self, login: Login, model: str | None) -> dict[str, bytes]:
        return dict(login.files)

    def parse(self, stdout: str) -> CliOutput:
        """A work run's final message and its usage file's report; a brief run's usage is its stream's
        `assistant.usage` events (one a call, so a run cut short still says what it used)."""
        stream, _, usage_text = stdout.partition(USAGE_MARK)
        text, streamed, failed = "", Usage(), None
        for event in json_lines(stream):
            said = event.get("data") or {}  # a Copilot stream event's fields
            if event.get("type") == "assistant.message":
                text = str(said["content"]) if said.get("content") else text
            elif event.get("type") == "assistant.usage":
                streamed = streamed + _usage(said)
            elif event.get("type") == "session.error":
                failed = str(said.get("message"))
        usage = Usage()
        metrics = (last_json_object(usage_text) or {}).get("modelMetrics") or {}
        for model in metrics.values():
            usage = usage + _usage((model or {}).get("usage") or {})
        error = None if text else f"Copilot CLI printed no final message: {failed or stream[-500:]!r}"
        return CliOutput(text, usage if usage != Usage() else streamed, None, None, error)


def _usage(used: dict[str, Any]) -> Usage:
    """Copilot's token counts (a usage file's `modelMetrics.<m>.usage`, an `assistant.usage` event)."""
    return Usage(
        int(used.get("inputTokens") or 0),
        int(used.get("outputTokens") or 0),
        int(used.get("cacheReadTokens") or 0),
    )
