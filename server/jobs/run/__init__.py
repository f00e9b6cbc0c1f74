"""A job's run, from a free slot to its final state, on the jobs' own event loop and thread.

`lifecycle.py` `Lifecycle`, a job's run; `job_thread.py` the jobs' loop and thread; `fair_share.py` the
slots shared by callers in turn; `store_sink.py` the orchestrator's reports and journal into the store;
`gc_freeze.py` the warm server's objects frozen out of full garbage collections.
"""
