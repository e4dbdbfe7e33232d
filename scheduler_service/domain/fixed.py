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
from datetime import UTC, datetime, timedelta
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


@dataclass(frozen=True, slots=True)
class MissFacts:
    """What the scheduler knows when it finds a fixed start missed (at start + tolerance)."""

    pool: str
    queue: str
    activity_type: str
    start_at: datetime
    # Whether any scheduler replica ran at the start time; if not, from when to when none did
    # (None: not known, e.g. no replica was recorded before it).
    scheduler_ran: bool = True
    down_from: datetime | None = None
    down_to: datetime | None = None
    dependencies_pending: bool = False
    queue_paused: bool = False
    needs_resources: bool = False
    # Connected workers of the pool; those that run the task's queue and type, their slots, how
    # many of those run an attempt and how many of these are other fixed starts, and how many
    # free ones are held idle for other fixed starts.
    workers_in_pool: int = 0
    workers_for_type: int = 0
    slots: int = 0
    busy: int = 0
    busy_fixed: int = 0
    held_for_others: int = 0


@dataclass(frozen=True, slots=True)
class Miss:
    # A short code (the metrics' reason label) and the sentence stored as the task's miss_reason.
    kind: str
    message: str


def _t(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds")


def _slots(n: int) -> str:
    return f"{n} slot{'' if n == 1 else 's'}"


def _every_slot(n: int) -> str:
    return "the one slot" if n == 1 else f"all {n} slots"


def miss_reason(facts: MissFacts) -> Miss:
    """Why a fixed start was missed, most decisive first."""
    if not facts.scheduler_ran:
        since = f" from {_t(facts.down_from)}" if facts.down_from else ""
        until = f" to {_t(facts.down_to)}" if facts.down_to else ""
        return Miss("scheduler_down", f"the scheduler was not running at the start time (down{since}{until})")
    if facts.queue_paused:
        return Miss("queue_paused", f"queue {facts.queue} was paused")
    if facts.dependencies_pending:
        return Miss("dependencies", "its dependencies had not completed by the start + tolerance")
    if facts.workers_in_pool == 0:
        return Miss("no_worker", f"no worker of pool {facts.pool} connected")
    if facts.workers_for_type == 0:
        return Miss(
            "no_worker_for_type",
            f"no worker of pool {facts.pool} runs activity type {facts.activity_type} on queue {facts.queue}",
        )
    free = facts.slots - facts.busy - facts.held_for_others
    where = f"of the workers of pool {facts.pool} that run it"
    if free <= 0:
        if facts.busy_fixed + facts.held_for_others >= facts.slots:
            verb = "ran or was" if facts.slots == 1 else "ran or were"
            return Miss(
                "capacity_fixed",
                f"held capacity in use by other fixed tasks: {_every_slot(facts.slots)} {where} {verb} held "
                "for other fixed starts",
            )
        verb = "was" if facts.slots == 1 else "were"
        return Miss(
            "no_free_slot",
            f"no free slot: {_every_slot(facts.slots)} {where} {verb} busy "
            f"({facts.busy - facts.busy_fixed} with regular work)",
        )
    if facts.needs_resources:
        return Miss("resources", "the resources it needs were not free")
    verb = "was" if free == 1 else "were"
    return Miss(
        "not_dispatched",
        f"not dispatched by the start + tolerance although {_slots(free)} {where} {verb} free",
    )
