"""The job registry: background runs, the SQLite store, stored records and the views callers read."""
