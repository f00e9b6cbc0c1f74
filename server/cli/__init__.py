"""The `conclave` command line: ask, status, show, serve, install, doctor, sandbox build, config check."""
