"""The jobs: two doors over rooms that import only downward.

`service.py` (`JobService`: submit, wait, cancel, steer) and `lookup.py` (`JobLookup`: every read) are
the doors, `worker.py` the queue's (`conclave worker`). Below them each room imports only rooms under
it (docs/ARCHITECTURE.md's table): `upkeep/` (pruning, heartbeats, takeovers, readiness) and `run/` (a
job's run to its final state, on the jobs' own thread), side by side; then `admission/` (what submit
checks, the team shaped by the caller's limits), `context/` (what a team is given besides the task: the
caller's files, an earlier job's rounds, steering notes), `read/` (the views and what they read),
`queue.py` (the Redis queue), `store/`, and `request.py` (what a caller asks) and `derived.py` (what the
server derived of a job), which import nothing of jobs/.
"""
