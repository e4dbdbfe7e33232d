"""How often a replica repeats a read on a timer when the read's cost grows with the data: the
backlog's counts (the queue metrics, the KEDA scaler's stream) read every pending task, so with a
backlog of a million they took 350 ms every 5 s per replica, and every second per KEDA stream.
Such a read waits its interval, or longer once it costs more than READ_SHARE of that: what it
costs the database stays bounded whatever the backlog, and its figures are older only while the
backlog is that large."""

from __future__ import annotations

# The most of its own period a periodic read may spend (of one database connection).
READ_SHARE = 0.05


def paced(interval: float, took: float) -> float:
    """The wait, in seconds, before the next run of a periodic read that took `took` seconds."""
    return max(interval, took / READ_SHARE)
