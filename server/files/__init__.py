"""Files on the host: safe tree access, the caller's context folders, workspaces, diffs, apply, agent tools."""
