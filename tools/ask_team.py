"""`ask_team`: hand a task to a team of agents; returns the job, finished or still running."""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context
from pydantic import Field

from conclave.files.contexts import ContextPath
from conclave.jobs.views import JobView
from conclave.settings import MAX_WAIT_S
from conclave.tools._deps import caller, result, service
from conclave.tools._progress import ProgressReporter


async def ask_team(
    task: Annotated[
        str,
        Field(description="The whole task, self-contained: the team sees nothing else (no chat history)."),
    ],
    ctx: Context,
    team: Annotated[
        str | None,
        Field(
            description="A preset name (see list_teams), or the path of a team YAML file in the user's team "
            "folder or a folder the user listed in CONCLAVE_TEAM_DIRS (a project's own team files "
            "are not trusted); omit for the default. The `local` preset is a tiny demo model: do "
            "not use it for real work."
        ),
    ] = None,
    context_paths: Annotated[
        list[ContextPath] | None,
        Field(
            description="Project folders copied into every agent's workspace, so their files go to every "
            "model provider in the team (the originals are never touched while the team works); "
            "the result carries a diff of the winner's changes."
        ),
    ] = None,
    wait_seconds: Annotated[
        float,
        Field(ge=0, le=MAX_WAIT_S, description=f"Seconds to wait for the result (at most {MAX_WAIT_S})."),
    ] = 45,
    apply: Annotated[
        bool | Literal["force"],
        Field(
            description="After the vote, apply the winner's changes to the context_paths with permission "
            "'write': true applies only if the team reached consensus (a strict majority of "
            'the votes), "force" applies whatever the vote; nothing is applied if files '
            "there changed meanwhile."
        ),
    ] = False,
    force_binary: Annotated[
        bool,
        Field(
            description="With apply: also apply binary changes, added or modified. The patch cannot show "
            "them as text, so apply holds them back otherwise (listed in the result)."
        ),
    ] = False,
    allow_artifacts: Annotated[
        bool,
        Field(
            description="With apply: also apply compiled or loadable artefacts (__pycache__/, *.pyc, *.so, "
            "*.dll, ...), which apply holds back otherwise. VCS metadata (.git) is never applied."
        ),
    ] = False,
    allow_autorun: Annotated[
        bool,
        Field(
            description="With apply: also apply files that run code or widen a coding agent's permissions "
            "on their own (.vscode/tasks.json, .envrc, .claude/ settings and hooks, .mcp.json, "
            "package.json install scripts, CI workflows, git hooks, ...), which apply holds back "
            "otherwise (listed in the result with why). Pass it only after the user has read them."
        ),
    ] = False,
    verify: Annotated[
        str | None,
        Field(
            description='A shell command that checks an answer\'s files, e.g. "pytest -q" '
            "(needs context_paths and Docker; the sandbox image's tools). "
            "It runs on each answer's reviewed patch (your files plus what apply would write) in a "
            "fresh sandbox with no network, and passes when it exits 0 and the test runner's own "
            "summary (pytest, unittest) reports at least the tests your files' run does, none failed "
            "(the exit code alone when that run prints no summary); voters see each result, and an "
            "answer whose check failed cannot win while "
            "one that passed has votes. Default: the team file's `verify`."
        ),
    ] = None,
    max_cost_usd: Annotated[
        float | None,
        Field(
            gt=0,
            description="Stop the job once it has spent this many US dollars (every agent needs a "
            "price) and return the best-supported answer so far. Default: the team's.",
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        Field(
            ge=1,
            description="Stop the job once its agents have used this many tokens (input and output) "
            "and return the best-supported answer so far. Default: the team's.",
        ),
    ] = None,
    follow_up: Annotated[
        str | None,
        Field(
            description="The job_id of an earlier, finished job to continue: the same team goes on from its "
            "answer and files (task: your follow-up message, e.g. the failing test output). Its "
            "context_paths, verify and budgets carry over unless given; apply does not."
        ),
    ] = None,
) -> JobView:
    """Ask a team of LLM agents (different models) to solve a task: each writes an answer, they read
    each other's anonymously, improve or vote, and the winner writes the final answer.

    Returns the job. If `state` is `completed`, `answer` holds the final answer. If it is still
    `queued`, `running` or `presenting`, call `get_status` with the `job_id` (it waits up to
    `wait_seconds` for the job to finish); `read_workspace` shows every answer and the transcript,
    and with context_paths the diff (`path="@diff"`) and every file the agents wrote. The first
    result carries an `estimate` of what the job may use. To go on from a finished job (its tests
    fail, a requirement changed), pass `follow_up=job_id`; to redirect a running one, use `steer_job`.
    """
    jobs = service(ctx)
    # everything is checked by submit (the CLI shares it): the task, the team and its keys, the context
    # paths, apply, verify (needs context paths and Docker) and the budgets (a cost budget needs prices)
    paths = None if context_paths is None else list(context_paths)  # a follow-up carries None over
    who = caller(ctx)
    view = await jobs.submit(
        task,
        team,
        paths,
        apply,
        force_binary,
        allow_artifacts=allow_artifacts,
        allow_autorun=allow_autorun,
        verify=verify,
        max_cost_usd=max_cost_usd,
        max_tokens=max_tokens,
        follow_up=follow_up,
        caller=who,
    )
    progress = ProgressReporter(ctx)
    await progress.start(view)
    if wait_seconds > 0 and not view.done:
        view = await jobs.wait(view.job_id, wait_seconds, progress, caller=who)
    return result(view)
