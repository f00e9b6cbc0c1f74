#!/usr/bin/env bash
# The whole test suite with the job store in PostgreSQL: every test's settings name a fresh schema of one
# throwaway cluster (tests/conftest.py `suite_database`, tests/postgres.py; Debian's `postgresql`, which
# .ci/test-env.sh installs). As long as the suite itself, so not part of every CI run: run it by hand
# after .ci/test-env.sh, and commit its summary, bench/results/suite-postgres.json (with pytest arguments,
# a partial run such as the failures again: suite-postgres-rerun.json).
#   bash .ci/suite-postgres.sh [pytest arguments...]
set -uo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp -d /tmp/pg-suite-XXXXXX)
started=$(date +%s)
commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo "+changes")
CONCLAVE_TEST_SUITE_DATABASE=postgres .venv/bin/python -m pytest -q \
  --junitxml="$report/junit.xml" "$@" 2>&1 | tee "$report/log"
status=${PIPESTATUS[0]}
.venv/bin/python - "$report/junit.xml" "$started" "$status" "$commit" "$*" <<'PY'
import datetime, json, sys, time
import xml.etree.ElementTree as ET

junit, started, status, commit, arguments = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
cases = list(ET.parse(junit).getroot().iter("testcase"))
def ident(case):
    return f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
failed = [ident(c) for c in cases if c.find("failure") is not None or c.find("error") is not None]
skipped = [ident(c) for c in cases if c.find("skipped") is not None]
result = {
    "what": "the whole suite with CONCLAVE_DATABASE_URL naming PostgreSQL (.ci/suite-postgres.sh)",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": commit,  # as the run began
    "pytest_arguments": arguments,
    "passed": len(cases) - len(failed) - len(skipped),
    "failed": len(failed),
    "skipped": len(skipped),
    "pytest_exit": status,
    "wall_s": round(time.time() - started),
    "failures": failed,
    "skips": skipped,
}
name = "suite-postgres.json" if not arguments else "suite-postgres-rerun.json"
with open(f"bench/results/{name}", "w") as out:
    json.dump(result, out, indent=2)
    out.write("\n")
print({k: v for k, v in result.items() if k not in ("failures", "skips")})
PY
exit "$status"
