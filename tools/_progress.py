"""MCP progress notifications for a call that waits on a job: one short message per change."""

from __future__ import annotations

from fastmcp import Context

from conclave.jobs.read.views import JobView


def changes(before: JobView | None, after: JobView) -> list[str]:
    """What moved between two views, in words: "B posted B1", "A voted B1", "round 2", "presenting"."""
    if before is None:
        return [f"job {after.job_id} {after.state}: {after.phase}"]
    said: list[str] = []
    rounds = [view.progress.round if view.progress is not None else 0 for view in (before, after)]
    if rounds[1] != rounds[0] and rounds[1] > 1:
        said.append(f"round {rounds[1]}")
    previous = {agent.letter: agent for agent in before.agents}
    for agent in after.agents:
        old = previous.get(agent.letter)
        if (old is None or agent.answers > old.answers) and agent.answers:
            said.append(f"{agent.letter} posted {agent.letter}{agent.answers}")
        if agent.vote and (old is None or agent.vote != old.vote):
            said.append(f"{agent.letter} voted {agent.vote}")
        if agent.state == "failed" and (old is None or old.state != "failed"):
            said.append(f"{agent.letter} failed")
    if after.state != before.state:
        said.append(after.state)
    return said


class ProgressReporter:
    """Turns successive job views into progress notifications with a strictly increasing counter."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._last: JobView | None = None
        self._count = 0

    async def start(self, view: JobView) -> None:
        await self._send(changes(None, view))
        self._last = view

    async def __call__(self, view: JobView) -> None:
        said = changes(self._last, view)
        self._last = view
        if said:
            await self._send(said)

    async def _send(self, said: list[str]) -> None:
        self._count += 1
        await self._ctx.report_progress(self._count, None, "; ".join(said))
