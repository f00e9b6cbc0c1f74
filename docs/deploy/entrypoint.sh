#!/bin/sh
# Runs `conclave "$@"` (the image's entrypoint: docs/deploy/Dockerfile).
#
# An HTTP front reads its per-caller tokens from $CONCLAVE_HOME/http-tokens.json only when that is a
# regular file of its own user that no one else can read (server/app/tokens.py). A mounted secret is
# not: compose bind-mounts the host's file, Kubernetes mounts a link owned by root. So a secret mounted
# at /run/secrets/http-tokens.json is copied there, 0600, at start; a changed secret takes effect at the
# front's next restart.
set -eu
tokens=/run/secrets/http-tokens.json
if [ -f "$tokens" ]; then
    mkdir -p "$CONCLAVE_HOME"
    chmod 0700 "$CONCLAVE_HOME"
    install -m 0600 "$tokens" "$CONCLAVE_HOME/http-tokens.json"
fi
exec conclave "$@"
