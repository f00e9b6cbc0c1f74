"""Resource links a finished job's result carries (served by conclave.app.job_resources)."""

from __future__ import annotations

from mcp.types import ResourceLink

from conclave.jobs.read.views import JobView

ROOT = "conclave://jobs"


def links(view: JobView) -> list[ResourceLink]:
    """Links a finished job's result carries: the transcript, the winning answer, and the diff."""
    if not view.done:
        return []
    found = [
        ResourceLink(
            type="resource_link",
            name=f"{view.job_id} transcript",
            uri=f"{ROOT}/{view.job_id}/transcript",
            mime_type="text/plain",
        )
    ]
    winner = view.result.winner if view.result is not None else None
    if winner:
        found.append(
            ResourceLink(
                type="resource_link",
                name=f"answer {winner}",
                uri=f"{ROOT}/{view.job_id}/answers/{winner}",
                mime_type="text/plain",
            )
        )
    if view.diff_summary and view.diff_summary.patch_chars:
        found.append(
            ResourceLink(
                type="resource_link",
                name=f"{view.job_id} diff",
                uri=f"{ROOT}/{view.job_id}/diff",
                mime_type="text/x-diff",
                size=view.diff_summary.patch_chars,
            )
        )
    return found
