"""Lanes: groups of the suite's end-to-end tests run again, in a sub-pytest, against another engine."""
