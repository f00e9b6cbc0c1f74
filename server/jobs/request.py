"""A job as the caller asks for it: one model from ask_team's input schema to the stored job.

`JobRequest` is ask_team's parameters (tools/ask_team.py adds only `wait_seconds`, how long the call
waits), the argument of `JobService.submit`, what the store keeps of the job (jobs/store/sql.py) and what
`conclave ask` builds from its flags (cli/commands.py). Its field descriptions are the tool's
documentation, read by a calling model, so they name no internals.

The fields declare the shape (types, bounds); what the shape cannot say (a non-empty task, apply needs
a write context path, a cost budget needs prices) is checked by jobs/admission/admit.py and
jobs/admission/team_shape.py. A value of the wrong shape is refused as an `InputError` naming the field,
the value and the fix, as those checks are, whoever builds the request.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from conclave.errors import InputError
from conclave.files.contexts import ContextPath, item_error
from conclave.files.review import Consent
from conclave.jobs.derived import REQUEST_FIELDS

# true: only with consensus; "force": whatever the vote. Strict: only a real true, false or "force" (a
# lax bool would read "yes" or 1 as consent to write the caller's files), here as in ask_team's schema.
ApplyMode = StrictBool | Literal["force"]
# What to do about a value of the wrong shape, by field (the same words as the checks after it).
FIXES = {
    "task": "give the team a non-empty task",
    "team": "give a preset name (see list_teams) or a team file's path, or leave it out",
    "context_paths": 'give a list like [{"path": "/abs/project", "permission": "read"}]',
    "apply": 'use true (apply only with consensus), "force" or false',
    "force_binary": "use true or false",
    "allow_artifacts": "use true or false",
    "allow_autorun": "use true or false",
    "verify": "give a shell command that exits 0 when the files pass, e.g. 'python3 -m unittest -q'",
    "max_cost_usd": "give a positive number of US dollars, e.g. 0.50",
    "max_tokens": "give a positive whole number of tokens (in and out), e.g. 200000",
    "max_tokens_per_member": "give a positive whole number of tokens (in and out), e.g. 300000",
    "follow_up": "give the job_id of an earlier job (cj-...)",
}


class JobRequest(BaseModel):
    """A job as the caller asked for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Annotated[
        str,
        Field(description="The whole task, self-contained: the team sees nothing else (no chat history)."),
    ]
    team: Annotated[
        str | None,
        Field(
            description="A preset name (see list_teams), or the path of a team YAML file in the user's team "
            "folder or a folder the user listed in CONCLAVE_TEAM_DIRS (a project's own team files "
            "are not trusted); omit for the default. The `local` preset is a tiny demo model: do "
            "not use it for real work."
        ),
    ] = None
    # None: none given (a follow-up then carries the earlier job's over); [] is none, said outright
    context_paths: Annotated[
        list[ContextPath] | None,
        Field(
            description="Project folders copied into every agent's workspace, so their files go to every "
            "model provider in the team (the originals are never touched while the team works); "
            "the result carries a diff of the winner's changes."
        ),
    ] = None
    apply: Annotated[
        ApplyMode,
        Field(
            description="After the vote, apply the winner's changes to the context_paths with permission "
            "'write': true applies only if the team reached consensus (a strict majority of "
            'the votes), "force" applies whatever the vote; nothing is applied if files '
            "there changed meanwhile."
        ),
    ] = False
    force_binary: Annotated[
        StrictBool,
        Field(
            description="With apply: also apply binary changes, added or modified. The patch cannot show "
            "them as text, so apply holds them back otherwise (listed in the result)."
        ),
    ] = False
    allow_artifacts: Annotated[
        StrictBool,
        Field(
            description="With apply: also apply compiled or loadable artefacts (__pycache__/, *.pyc, *.so, "
            "*.dll, ...), which apply holds back otherwise. VCS metadata (.git) is never applied."
        ),
    ] = False
    allow_autorun: Annotated[
        StrictBool,
        Field(
            description="With apply: also apply files that run code or widen a coding agent's permissions "
            "on their own (.vscode/tasks.json, .envrc, .claude/ settings and hooks, .mcp.json, "
            "package.json install scripts, CI workflows, git hooks, ...), which apply holds back "
            "otherwise (listed in the result with why). Pass it only after the user has read them."
        ),
    ] = False
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
    ] = None
    max_cost_usd: Annotated[
        float | None,
        Field(
            gt=0,
            description="Stop the job once it has spent this many US dollars (every agent needs a "
            "price) and return the best-supported answer so far. Default: the team's.",
        ),
    ] = None
    max_tokens: Annotated[
        int | None,
        Field(
            ge=1,
            description="Stop the job once its agents have used this many tokens (input and output) "
            "and return the best-supported answer so far. Default: the team's.",
        ),
    ] = None
    max_tokens_per_member: Annotated[
        int | None,
        Field(
            ge=1,
            description="Stop any one member once it has used this many tokens (input and output): it "
            "takes no more turns (its state: stopped) and the job goes on with the others, e.g. to bound "
            "each coding-agent CLI member's share of a plan. Default: each member's own budget.max_tokens "
            "in the team file.",
        ),
    ] = None
    follow_up: Annotated[
        str | None,
        Field(
            description="The job_id of an earlier, finished job to continue: the same team goes on from its "
            "answer and files (task: your follow-up message, e.g. the failing test output). Its "
            "context_paths, verify and budgets carry over unless given; apply does not."
        ),
    ] = None

    def consent(self) -> Consent:
        """What apply may write beyond plain text changes (files/review.py)."""
        return Consent(
            force_binary=self.force_binary,
            allow_artifacts=self.allow_artifacts,
            allow_autorun=self.allow_autorun,
        )

    @model_validator(mode="wrap")
    @classmethod
    def _refused_in_words(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A value of the wrong shape as an InputError (field, value, fix), not pydantic's report."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise _in_words(exc, data) from exc


def stored_request(task: str, options_json: str, follow_up: str | None) -> JobRequest:
    """The request of a job stored before requests were (migration 6): its task, and what its options
    kept of the rest (context paths, apply and its consents); verify and budgets live in its team."""
    options = json.loads(options_json)
    kept = {key: options[key] for key in (*REQUEST_FIELDS, "context_paths") if key in options}
    return JobRequest.model_validate({"task": task, "follow_up": follow_up, **kept})


def _in_words(exc: ValidationError, data: Any) -> InputError:
    """The first problem of `exc` as the InputError a caller can act on."""
    error = exc.errors()[0]
    where = error["loc"]
    field = str(where[0]) if where else ""
    value = data.get(field) if isinstance(data, dict) else getattr(data, field, None)
    if field == "context_paths" and len(where) > 1 and isinstance(where[1], int) and isinstance(value, list):
        item = value[where[1]]
        try:
            ContextPath.model_validate(item)
        except ValidationError as alone:  # the item's own problems, located within it
            return item_error(where[1], item, alone)
    if error["type"] == "extra_forbidden":
        return InputError(field, value, f"there is no such argument; leave {field} out")
    fix = FIXES.get(field, error["msg"].removeprefix("Value error, "))
    return InputError(field or "request", value if field else data, fix)
