"""Coding-agent CLIs as team members: one module per CLI (argv, environment, output), and CliMember.

The coordination layer calls `CliMember.run(prompt, schema)` for a member's work and its decision; a
CLI runs headless inside the agent's sandbox container (sandbox/container.py) with a private HOME on
the container's tmpfs holding the user's login (member.py). The CLI modules know their CLI's flags and
JSON output and nothing of the protocol (docs/subscriptions.md says what they rely on).
"""
