"""The read model: a job's views and pages, its files as read_workspace reads them, the teams, its link.

`view_read.py` reads a view's or a web page's parts in one thread hop (its notes too); `views.py` holds
`JobView` and its words; `reader.py` what `read_workspace` can read (and an earlier job's best answer
and verdict); `teams.py` the presets as callers see them; `web_link.py` where a job's live page is. The
callers (the CLI, the tools, the web view) may import these, and reach them through `JobLookup`
(jobs/lookup.py), which checks the job id and the caller first.
"""
