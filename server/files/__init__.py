"""Files on the host.

Safe tree access, the caller's context folders, workspaces, diffs, apply, agent tools.
"""
