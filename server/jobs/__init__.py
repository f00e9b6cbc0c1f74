"""The job registry: the service and its parts (admission, lifecycle), records; the read model; the store."""
