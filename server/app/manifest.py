"""Record what `conclave serve` answers to the MCP handshake, for its stdio front (manifest.json).

    python -m conclave.app.manifest           # exit 1 and name the difference if manifest.json is stale
    python -m conclave.app.manifest --write   # record it again

For every protocol version reached by the `initialize` handshake, a real server (`conclave serve
--no-front`, state in a temporary folder) is asked `initialize` and then each list method its
capabilities announce; the answers are stored as the server wrote them. The front trusts the shipped
file only while `record()` would write the same one (manifest_key.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

from conclave.app.manifest_key import MANIFEST, installed_versions

LISTS = {
    "tools": ["tools/list"],
    "resources": ["resources/list", "resources/templates/list"],
    "prompts": ["prompts/list"],
}


def record() -> dict[str, Any]:
    """The manifest as the installed server answers today: the answers at the latest protocol version,
    and under `differs` those of any other version whose answers are not the same."""
    with ThreadPoolExecutor(max_workers=len(HANDSHAKE_PROTOCOL_VERSIONS)) as pool:
        sessions = dict(
            zip(HANDSHAKE_PROTOCOL_VERSIONS, pool.map(_session, HANDSHAKE_PROTOCOL_VERSIONS), strict=True)
        )
    common = sessions[LATEST_HANDSHAKE_VERSION]
    return {
        "versions": installed_versions(),
        "protocols": list(HANDSHAKE_PROTOCOL_VERSIONS),
        "latest": LATEST_HANDSHAKE_VERSION,
        **common,
        "differs": {version: session for version, session in sessions.items() if session != common},
    }


def _session(version: str) -> dict[str, Any]:
    """One server, one handshake at `version`: the initialize result and every list result."""
    with tempfile.TemporaryDirectory(prefix="conclave-manifest-") as home:
        # a throwaway store of its own: never the database or jobs' folder the environment names
        kept = {
            k: v for k, v in os.environ.items() if k not in ("CONCLAVE_DATABASE_URL", "CONCLAVE_JOBS_DIR")
        }
        env = {**kept, "CONCLAVE_HOME": home, "FASTMCP_LOG_LEVEL": "WARNING"}
        server = subprocess.Popen(
            [sys.executable, "-m", "conclave", "serve", "--no-front"],
            env=env,
            cwd=home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert server.stdin is not None and server.stdout is not None
        calls = iter(range(1, 100))

        def ask(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
            key = next(calls)
            message = {
                "jsonrpc": "2.0",
                "id": key,
                "method": method,
                **({"params": params} if params else {}),
            }
            server.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
            server.stdin.flush()  # type: ignore[union-attr]
            answer = json.loads(server.stdout.readline())  # type: ignore[union-attr]
            if answer.get("id") != key or "result" not in answer:
                raise RuntimeError(f"conclave serve answered {method} with {answer}")
            return answer["result"]  # type: ignore[no-any-return]

        try:
            hello = {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "conclave-manifest", "version": "1"},
            }
            initialize = ask("initialize", hello)
            server.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            results = {
                method: ask(method)
                for capability, methods in LISTS.items()
                if capability in initialize["capabilities"]
                for method in methods
            }
        finally:
            server.stdin.close()
            server.wait(timeout=30)
    # The version is the front's to fill in (the client's, when the server speaks it).
    assert initialize.pop("protocolVersion") == version
    return {"initialize": initialize, "results": results}


def main(argv: list[str]) -> int:
    fresh = record()
    if "--write" in argv:
        MANIFEST.write_text(json.dumps(fresh, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {MANIFEST}")
        return 0
    shipped = json.loads(MANIFEST.read_text(encoding="utf-8")) if MANIFEST.exists() else None
    if shipped == fresh:
        print(f"{MANIFEST} is up to date")
        return 0
    print(f"{MANIFEST} differs from what the server answers; run `python -m conclave.app.manifest --write`")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
