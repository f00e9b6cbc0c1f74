"""A follow-up's starting files: the earlier job's answer laid over the caller's folders as they are now.

    jobs/<job_id>/start/<name>/   what every agent's working copy starts from (Workspaces.create)

base/ stays the caller's folder now (the diff base and apply's conflict check), so the follow-up's
diff is against the folder as it is: an earlier diff the caller applied is not shown again, and a
caller's edit since then is kept. Per file, with E0 the file when the earlier job started (its
manifest), E1 in the earlier answer's files, and C in the folder now:
    E1 == E0          the earlier answer left it alone        start from C (the caller's version)
    C == E0           the caller left it alone                start from E1 (the earlier answer's)
    C == E1           the earlier change was applied          start from C
    otherwise         both changed it differently             FollowUpConflict, nothing is started
A file of the earlier answer that the folder's .gitignore ignores, and that is not in the folder, is
left out (a cache a command wrote). A context path the earlier job did not have starts from base/.
Blocking; Workspaces.carry runs it in a worker thread.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conclave.errors import FollowUpConflict
from conclave.files.contexts import ContextManifest, CopiedContext
from conclave.files.trees import IgnoreRules, copy_file, copy_tree, list_tree, sha256_file


def carry(
    earlier_manifest: ContextManifest,
    earlier_tree: Path,
    base: Path,
    manifest: ContextManifest,
    start: Path,
    earlier_id: str,
) -> dict[str, list[str]]:
    """Build `start` (absent before) from `base` and the earlier answer's files `earlier_tree`; return the
    paths taken from the earlier answer per context name. Raises FollowUpConflict, leaving no `start`."""
    by_source = {context.source: context for context in earlier_manifest.contexts}
    plans: list[tuple[CopiedContext, dict[str, str | None]]] = []
    for context in manifest.contexts:
        earlier = by_source.get(context.source)
        if earlier is not None and (earlier_tree / earlier.name).is_dir():
            plans.append((context, _plan(earlier, earlier_tree / earlier.name, context, earlier_id)))
    tmp = start.with_name(f".{start.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    taken: dict[str, list[str]] = {}
    try:
        copy_tree(base, tmp, list_tree(base))
        for context, plan in plans:
            earlier = by_source[context.source]
            for rel, source in sorted(plan.items()):
                target = tmp / context.name / rel
                if target.exists():
                    target.unlink()
                if source is not None:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    copy_file(earlier_tree / earlier.name, rel, target)
            taken[context.name] = sorted(plan)
        os.rename(tmp, start)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return taken


def _plan(
    earlier: CopiedContext, tree: Path, context: CopiedContext, earlier_id: str
) -> dict[str, str | None]:
    """Which files start from the earlier answer: rel -> rel in its tree, or None (it deleted the file)."""
    answer = list_tree(tree).files
    rules = IgnoreRules(Path(context.source)) if Path(context.source).is_dir() else None
    plan: dict[str, str | None] = {}
    conflicts = []
    for rel in sorted(set(answer) | set(earlier.files)):
        before = earlier.files[rel].sha256 if rel in earlier.files else None
        after = sha256_file(tree, rel) if rel in answer else None
        now = context.files[rel].sha256 if rel in context.files else None
        if after == before or now == after:
            continue  # the earlier answer left it alone, or the caller has it already
        if now == before:
            if after is not None and now is None and rules is not None and rules.ignored(rel):
                continue  # an ignored file the answer made (a cache): not the caller's
            plan[rel] = rel if after is not None else None
        else:
            conflicts.append(rel)
    if conflicts:
        raise FollowUpConflict(earlier_id, context.source, conflicts)
    return plan
