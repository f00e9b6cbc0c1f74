"""The read model: every read of a job (the lookup), its views and pages, its files, the teams, its link.

`lookup.py` `JobLookup` checks the job id and the caller before any read; `view_read.py` reads a view's
or a web page's parts in one thread hop; `views.py` holds `JobView` and its words; `reader.py` what
`read_workspace` can read; `teams.py` the presets as callers see them; `web_link.py` where a job's live
page is. The callers (the CLI, the tools, the web view) may import these, and reach the store only
through them.
"""
