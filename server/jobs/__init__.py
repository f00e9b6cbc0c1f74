"""The job registry: the service and its parts (admission, lifecycle, lookup), records, views; the store."""
