"""What `conclave install copilot` says that no file can hold: Copilot CLI approves tools only on its
command line, and it passes a server only the provider keys named in its own configuration."""

from __future__ import annotations


def copilot_hints(scope: str, keys: tuple[str, ...]) -> list[str]:
    """What Copilot CLI needs that no file can hold: its headless approvals, and keys set later."""
    trust = " --trust-folder" if scope == "project" else ""
    hints = [
        f'Copilot CLI approves tools only on its command line: copilot -p "..." --allow-tool=conclave{trust}'
    ]
    if scope == "project":
        hints.append(
            "Copilot CLI strips provider keys from a project server's environment: use --scope user "
            "(~/.copilot/mcp-config.json lists the keys set when you install) for a team with keys"
        )
    elif keys:
        hints.append(f"env passes on {', '.join(keys)}; run install again after setting another provider key")
    else:
        hints.append(
            "no provider key is set, so Conclave could run only the `local` demo team: set a key "
            "(e.g. ANTHROPIC_API_KEY), then run install again"
        )
    return hints
