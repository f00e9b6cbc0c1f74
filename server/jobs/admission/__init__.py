"""Admission: what submit checks before a job is stored, and what the job will run with.

`admit.py` `Admission`, the checks in order; `access.py` who may name which folders and team files;
`team_shape.py` the caller's verify and budgets laid over the team's, within the server's ceilings;
`estimate.py` what a job may use, from the team's past jobs; `reach.py` whether a team's own servers
answer.
"""
