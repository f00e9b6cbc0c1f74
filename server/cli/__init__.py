"""The `conclave` command line: ask, steer, status, show, teams, web, serve, install, doctor, gc and more."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# The clients `conclave install` knows, and where it may write (conclave.cli.install).
TARGETS = ("claude-code", "codex", "cursor", "vscode", "gemini", "copilot")
SCOPES = ("project", "user")
