"""The job store: the SQL over one SQLite file, its connections, schema and threads, and the awaited store.

`sql.py` holds the rows (`Store`), `new_job.py` the admitted job it writes, `async_store.py` the same calls
awaited from a server's event loop, `lanes.py` the threads they run in and `connections.py` the connections;
`migrations.py` the schema, `conversations.py` follow-up chains and notes, `progress_patch.py` a progress
update as `json_set` paths and `owners.py` whether the process owning a job is alive. The callers (the CLI,
the tools, the web view) reach none of it: they read through the service and its lookup (jobs/service.py,
jobs/lookup.py), which check the job id and the caller.
"""
