"""Fixed starts: admission, hold lead, hits and misses. Pure functions of state and `now`.

A fixed-start task occupies [start - tolerance, start + estimated_duration + tolerance] in its
pool. At any instant at most max(1, floor(max_workers x reservable_fraction)) reservations may
overlap; a submission that would exceed that is refused with the window where it would.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class MissPolicy(StrEnum):
    RUN_LATE = "run_late"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class FixedStart:
    start_at: datetime
    tolerance: timedelta
    on_miss: MissPolicy
    estimated_duration: timedelta

    @property
    def window(self) -> Interval:
        return Interval(self.start_at - self.tolerance, self.start_at + self.estimated_duration + self.tolerance)


@dataclass(frozen=True, slots=True)
class Interval:
    start: datetime
    end: datetime

    def overlaps(self, other: Interval) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True)
class Reservation:
    task_id: int
    window: Interval


@dataclass(frozen=True, slots=True)
class Conflict:
    """Where admission would exceed the pool's capacity, and the reservations already there."""

    capacity: int
    window: Interval
    conflict: Interval
    task_ids: tuple[int, ...]


class Refused(Exception):
    """Admission refused the fixed start at `index` of a submission (raised by the store)."""

    def __init__(self, pool: str, index: int, conflict: Conflict) -> None:
        super().__init__(f"pool {pool}: reservation conflict")
        self.pool = pool
        self.index = index
        self.conflict = conflict


def reservation_capacity(max_workers: int, reservable_fraction: float) -> int:
    """At least one reservation is always allowed: a pool of one worker can be fully reserved."""
    return max(1, math.floor(max_workers * reservable_fraction))


def admit(window: Interval, existing: Iterable[Reservation], capacity: int) -> Conflict | None:
    """None when `window` fits beside `existing`; else the first stretch where it does not."""
    inside = [r for r in existing if r.window.overlaps(window)]
    # Sweep the boundaries inside the new window; between two of them the overlap is constant.
    points = sorted({window.start, window.end, *(t for r in inside for t in (r.window.start, r.window.end))})
    points = [p for p in points if window.start <= p <= window.end]
    for left, right in itertools.pairwise(points):
        if left == right:
            continue
        segment = Interval(left, right)
        here = [r for r in inside if r.window.overlaps(segment)]
        if len(here) + 1 > capacity:
            return Conflict(capacity, window, segment, tuple(sorted(r.task_id for r in here)))
    return None


def admit_all(
    windows: Sequence[tuple[int, Interval]], existing: Sequence[Reservation], capacity: int
) -> tuple[int, Conflict] | None:
    """Admits several new windows in order, each beside the ones before it; the first that does
    not fit is returned with its index in `windows`."""
    accepted = list(existing)
    for index, window in windows:
        conflict = admit(window, accepted, capacity)
        if conflict is not None:
            return index, conflict
        accepted.append(Reservation(-1 - index, window))
    return None


def p90(samples: Sequence[float]) -> float | None:
    """The 90th percentile (nearest rank) of recent run times, None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def hold_lead(tolerance: timedelta, p90_run_time: float | None, max_hold: timedelta) -> timedelta:
    """How long before its start a fixed task holds a slot: long enough for the regular work
    that would otherwise take it to finish, at least its tolerance, at most max_hold."""
    typical = timedelta(seconds=p90_run_time or 0.0)
    return min(max(tolerance, typical), max_hold)


def hold_from(fixed: FixedStart, p90_run_time: float | None, max_hold: timedelta) -> datetime:
    return fixed.start_at - hold_lead(fixed.tolerance, p90_run_time, max_hold)


# One scheduling step: with tolerance 0 a task must start "exactly" on time, which in practice
# means on the first scheduling step at or after its time. Starts within one step count as hits,
# and the miss policy waits that long past start + tolerance.
SCHEDULING_STEP = timedelta(milliseconds=50)


def is_hit(actual: datetime, start_at: datetime, tolerance: timedelta) -> bool:
    return abs(actual - start_at) <= max(tolerance, SCHEDULING_STEP)


def missed(fixed: FixedStart, now: datetime) -> bool:
    return now > fixed.start_at + max(fixed.tolerance, SCHEDULING_STEP)


NO_WORKERS = "no workers in the pool"
DEPENDENCY_LATE = "a dependency finished late"
CAPACITY_IN_USE = "held capacity in use by other fixed tasks"


def miss_reason(*, workers_in_pool: int, dependencies_pending: bool) -> str:
    if workers_in_pool == 0:
        return NO_WORKERS
    if dependencies_pending:
        return DEPENDENCY_LATE
    return CAPACITY_IN_USE
