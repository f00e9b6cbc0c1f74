#!/usr/bin/env bash
# mypy on the import package as it is installed: server/ is `conclave` and tools/ is `conclave.tools`
# (pyproject's package-dir), which mypy cannot see through an editable install's import hook, so it
# reads them through a tree of links. Strict on the whole package ([tool.mypy] in pyproject).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/conclave"
for entry in "$root"/server/*; do ln -s "$entry" "$tree/conclave/"; done
ln -s "$root/tools" "$tree/conclave/tools"
cd "$tree"
"${MYPY:-$root/.venv/bin/mypy}" --config-file "$root/pyproject.toml" -p conclave
