#!/usr/bin/env bash
# Install the coding-agent CLIs that tests/test_agent_clis.py drives headless against fake models:
# Claude Code, Codex, Gemini CLI and GitHub Copilot CLI, pinned, into .ci/agents/ (git-ignored), cached: does
# nothing when the pinned versions are already there. Needs npm and the npm registry.
#   --ignore-scripts: Codex, Gemini CLI and Copilot need none (platform binaries come as optional
#   dependencies; Gemini CLI is JavaScript). Claude Code's
#   only script, install.cjs, copies its platform binary over the bin/claude.exe placeholder; it is
#   run explicitly below, with the Node of .ci/node when there is one.
set -euo pipefail
cd "$(dirname "$0")"
PREFIX="$PWD/agents"
PINS=(
  "@anthropic-ai/claude-code@2.1.330"
  "@openai/codex@0.169.0"
  "@github/copilot@1.0.102"
  "@google/gemini-cli@0.61.0"
)

source ./npm-pins.sh
install_pins "agent CLIs" "$PREFIX" "${PINS[@]}"

NODE="$PWD/node/node_modules/.bin/node"
[ -x "$NODE" ] || NODE="node"
CLAUDE="$PREFIX/node_modules/@anthropic-ai/claude-code"
if ! "$PREFIX/node_modules/.bin/claude" --version >/dev/null 2>&1; then
  (cd "$CLAUDE" && "$NODE" install.cjs)
fi
echo "agent CLIs: claude $("$PREFIX/node_modules/.bin/claude" --version), $("$PREFIX/node_modules/.bin/codex" --version)," \
  "$("$PREFIX/node_modules/.bin/copilot" --version | head -1), gemini $("$NODE" "$PREFIX/node_modules/@google/gemini-cli/bundle/gemini.js" --version)"
