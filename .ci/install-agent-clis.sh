#!/usr/bin/env bash
# Install the coding-agent CLIs that tests/test_agent_clis.py drives headless against fake models:
# Claude Code, Codex, Gemini CLI and GitHub Copilot CLI, pinned, into .ci/agents/ (git-ignored), cached: does
# nothing when the pinned versions are already there. Needs npm and the npm registry.
# Also Claude Code 2.1.197 into .ci/agents-node20/ (git-ignored): what `npm install` resolves on Node 20,
# since later versions need Node 22. It gates a project's permissions behind workspace trust, which
# `conclave install` handles (server/cli/claude_trust.py); tests/test_agent_clis.py runs both versions.
#   --ignore-scripts: Codex, Gemini CLI and Copilot need none (platform binaries come as optional
#   dependencies; Gemini CLI is JavaScript). Claude Code's
#   only script, install.cjs, copies its platform binary over the bin/claude.exe placeholder; it is
#   run explicitly below, with the Node of .ci/node when there is one.
set -euo pipefail
cd "$(dirname "$0")"
PREFIX="$PWD/agents"
PREFIX_NODE20="$PWD/agents-node20"
PINS=(
  "@anthropic-ai/claude-code@2.1.330"
  "@openai/codex@0.169.0"
  "@github/copilot@1.0.102"
  "@google/gemini-cli@0.61.0"
)

source ./npm-pins.sh
install_pins "agent CLIs" "$PREFIX" "${PINS[@]}"
install_pins "Claude Code for Node 20" "$PREFIX_NODE20" "@anthropic-ai/claude-code@2.1.197"

NODE="$PWD/node/node_modules/.bin/node"
[ -x "$NODE" ] || NODE="node"
CLAUDE="$PREFIX/node_modules/@anthropic-ai/claude-code"
if ! "$PREFIX/node_modules/.bin/claude" --version >/dev/null 2>&1; then
  (cd "$CLAUDE" && "$NODE" install.cjs)
fi
# The machine's Node (20) runs this one's install.cjs, as `npm install` there would.
if ! "$PREFIX_NODE20/node_modules/.bin/claude" --version >/dev/null 2>&1; then
  (cd "$PREFIX_NODE20/node_modules/@anthropic-ai/claude-code" && node install.cjs)
fi
echo "agent CLIs: claude $("$PREFIX/node_modules/.bin/claude" --version)," \
  "claude (Node 20) $("$PREFIX_NODE20/node_modules/.bin/claude" --version), $("$PREFIX/node_modules/.bin/codex" --version)," \
  "$("$PREFIX/node_modules/.bin/copilot" --version | head -1), gemini $("$NODE" "$PREFIX/node_modules/@google/gemini-cli/bundle/gemini.js" --version)"
