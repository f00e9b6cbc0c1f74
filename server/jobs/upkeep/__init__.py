"""What a server does beside running jobs: pruning, heartbeats, takeovers, and whether it can take jobs.

`maintenance.py` the watch loop (heartbeats, other processes' cancels and notes) and what runs at start;
`pruning.py` removing old jobs (`conclave gc`); `takeover.py` taking over the jobs of servers that died;
`readiness.py` whether the server can take jobs (its store, engine and queue answer).
"""
