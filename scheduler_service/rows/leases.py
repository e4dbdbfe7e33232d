"""The rows of the workers' lease renewal and of the leader's tick."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RenewedWorker:
    """A worker whose lease a renewal extended."""

    id: str


@dataclass(frozen=True, slots=True)
class LeaderCheck:
    """What the maintenance loop learns each tick: whether this replica leads, and whether another
    replica runs."""

    leading: bool
    others: bool


@dataclass(frozen=True, slots=True)
class MaintenanceDue:
    """Which of the leader's time-driven statements may find something to do now (each flag is
    true whenever its statement would take a row; the tick runs only those)."""

    schedules: bool
    start_deadlines: bool
    misses: bool
    expired_attempts: bool
    purge: bool
