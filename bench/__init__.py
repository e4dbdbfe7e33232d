"""Throughput benchmark of lowtide against Procrastinate and PgQueuer (run as `python -m bench`).

Every peer works the same no-op tasks on the same PostgreSQL server, each run in a database of
its own that is created for it and dropped afterwards; see `bench.__main__` for the output.
"""
