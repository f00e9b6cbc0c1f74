"""What a job's team is given besides its task: the caller's files, an earlier job's rounds, notes.

`files.py` a job's context paths admitted at submit, copied at start, then one owner of its files
through the run to its diff and apply; `follow_ups.py` what a follow-up carries over; `steering.py`
steering notes on their way to a running job.
"""
