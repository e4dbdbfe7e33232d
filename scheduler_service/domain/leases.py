"""How long a worker's lease runs, busy or idle (pure: leases.py applies it every tick).

Why it works this way: docs/architecture/fleet.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """The lease lengths, in seconds."""

    busy: float
    idle: float

    @classmethod
    def of(cls, *, lease_timeout: timedelta, idle_heartbeat_interval: timedelta) -> LeaseTerms:
        busy = lease_timeout.total_seconds()
        return cls(busy=busy, idle=busy + idle_heartbeat_interval.total_seconds())


@dataclass(slots=True)
class LeaseState:
    """What a session's lease renewal goes by (loop times, in seconds)."""

    # When it was last heard from (its hello, then its heartbeats).
    heard_at: float
    # A heartbeat came since the last renewal.
    heard: bool = False
    # When a renewal first found it running attempts (None while it runs none).
    busy_since: float | None = None
    # What the lease in the database was last set for: busy or idle, and the slots it records.
    # A new session's is the hello's: `lease_timeout`, the busy length.
    leased_busy: bool = True
    leased_slots: int = 0


def lease_left(state: LeaseState, *, busy: bool, now: float, terms: LeaseTerms) -> float:
    """Seconds of lease the worker has from `now` (0 or less: it has run out)."""
    # The length less the time gone, in that order: (since + length) - now rounds up past the
    # length when now is since (22.69 + 10 - 22.69 is 10.000000000000004).
    if not busy:
        return terms.idle - (now - state.heard_at)
    since = state.heard_at if state.busy_since is None else max(state.heard_at, state.busy_since)
    return terms.busy - (now - since)


def renewal(state: LeaseState, *, busy: bool, slots: int, now: float, terms: LeaseTerms) -> float | None:
    """The lease (seconds from `now`) to record for the worker this tick, or None when the one
    recorded still holds: it was not heard from, and neither its state (busy or idle) nor its
    slots changed. Updates `state` to what is recorded."""
    if busy and state.busy_since is None:
        state.busy_since = now
    elif not busy:
        state.busy_since = None
    if not (state.heard or busy != state.leased_busy or slots != state.leased_slots):
        return None
    state.heard = False
    state.leased_busy = busy
    state.leased_slots = slots
    return lease_left(state, busy=busy, now=now, terms=terms)
