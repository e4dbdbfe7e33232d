"""The room a plan keeps count of: tasks per slot of the plan's grid, the given tasks' and
commitments' apart from expected work's, with what each expected run would lose if moved
(scheduler_service.domain.planning plans on it)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from scheduler_service.domain.forecast import MICROSECOND


class Window(Protocol):
    """A run to count: a task of the plan (planning.PlanTask)."""

    @property
    def latest_start(self) -> datetime: ...
    @property
    def duration(self) -> timedelta: ...


class Committed(Protocol):
    """Room spoken for over [start, end) (planning.Commitment)."""

    @property
    def start(self) -> datetime: ...
    @property
    def end(self) -> datetime: ...
    @property
    def count(self) -> int: ...


class Room(Protocol):
    """The pool's room (planning.Capacity)."""

    @property
    def max_running(self) -> int: ...
    @property
    def committed(self) -> Sequence[Committed]: ...


class Load:
    """Tasks per slot of `resolution`, from a grid anchored at `now` rounded down to a multiple of
    the resolution since midnight UTC, so that slots line up with the grid's half hours."""

    def __init__(self, capacity: int, anchor: datetime, resolution: timedelta, slots: int) -> None:
        self.capacity = capacity
        self._anchor = anchor
        self._step = resolution
        self.step_us = resolution // MICROSECOND
        self.size = slots
        # What the planner made once for this grid and may ask again (planning._Table).
        self.memo: dict[object, Any] = {}
        # Every planned run, and the given tasks' and commitments' alone (not expected work).
        self._counts = [0] * slots
        self._firm = [0] * slots
        # Per slot, what each expected run in it would lose if moved (see `_reserve`).
        self._held: list[list[float]] = [[] for _ in range(slots)]

    @classmethod
    def for_tasks(cls, tasks: Sequence[Window], capacity: Room, now: datetime, resolution: timedelta) -> Load | None:
        """None when the pool cannot run out of room (everything fits at once), which spares
        the bookkeeping in the common case of a few held tasks."""
        if capacity.max_running >= len(tasks) + sum(c.count for c in capacity.committed):
            return None
        return cls.covering(tasks, capacity, now, resolution)

    @classmethod
    def covering(cls, tasks: Sequence[Window], capacity: Room, now: datetime, resolution: timedelta) -> Load:
        """The load of the commitments over the grid the tasks' windows cover."""
        midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        anchor = midnight + ((now - midnight) // resolution) * resolution
        horizon = max((max(t.latest_start, now) + t.duration for t in tasks), default=now)
        load = cls(capacity.max_running, anchor, resolution, math.ceil((horizon - anchor) / resolution) + 1)
        for commitment in capacity.committed:
            load.add(commitment.start, commitment.end, commitment.count)
        return load

    def shift(self, origin: datetime) -> int:
        """Microseconds from the grid's anchor to `origin`: a forecast's offset (microseconds since
        its origin) plus this is the offset the `*_at` methods take."""
        return (origin - self._anchor) // MICROSECOND

    def _span(self, start: datetime, end: datetime) -> range:
        return self._span_at((start - self._anchor) // MICROSECOND, (end - self._anchor) // MICROSECOND)

    def _span_at(self, start: int, end: int) -> range:
        """The slots [start, end) touches (microseconds since the anchor); a run of zero length
        still takes the slot it is in."""
        step = self.step_us
        first = start // step
        last = max(first + 1, -(-end // step))
        return range(max(0, first), min(len(self._counts), last))

    def add(self, start: datetime, end: datetime, count: int = 1, *, firm: bool = True) -> None:
        for i in self._span(start, end):
            self._counts[i] += count
            if firm:
                self._firm[i] += count

    def slots(self, start: datetime, end: datetime) -> range:
        return self._span(start, end)

    def slots_at(self, start: int, end: int) -> range:
        return self._span_at(start, end)

    def room(self) -> list[int]:
        """Per slot, the room left by the given tasks and commitments."""
        return [self.capacity - n for n in self._firm]

    def price_held(self, start: datetime, end: datetime, loss: float) -> None:
        for i in self._span(start, end):
            self._held[i].append(loss)

    def price(self, start: datetime, end: datetime) -> float:
        return self.price_at((start - self._anchor) // MICROSECOND, (end - self._anchor) // MICROSECOND)

    def price_at(self, start: int, end: int) -> float:
        """What a given run over [start, end) costs the expected work it would displace: in each
        slot with no room but for expected runs, the least any of them would lose."""
        held, counts, capacity = self._held, self._counts, self.capacity
        return sum(min(held[i]) for i in self._span_at(start, end) if held[i] and counts[i] >= capacity)

    def take(self, start: datetime, end: datetime) -> None:
        """A given run: where the slot is full with expected runs, the cheapest to move gives way."""
        for i in self._span(start, end):
            held = self._held[i]
            if held and self._counts[i] >= self.capacity:
                held.remove(min(held))
                self._counts[i] -= 1
        self.add(start, end)

    def peak(self, start: datetime, end: datetime, *, firm_only: bool = False) -> int:
        return self.peak_at(
            (start - self._anchor) // MICROSECOND, (end - self._anchor) // MICROSECOND, firm_only=firm_only
        )

    def peak_at(self, start: int, end: int, *, firm_only: bool = False) -> int:
        span = self._span_at(start, end)
        counts = self._firm if firm_only else self._counts
        return max(counts[span.start : span.stop], default=0)

    def fits(self, start: datetime, end: datetime, *, firm_only: bool = False) -> bool:
        return self.peak(start, end, firm_only=firm_only) < self.capacity

    def first_fit(
        self, starts: Iterable[tuple[float, int]], shift: int, span: int, *, firm_only: bool = False
    ) -> tuple[float, int] | None:
        """The first of `starts` ((score, offset): a run over [offset + shift, offset + shift +
        span), microseconds since the anchor) that `fits_at`; None when none does. One loop
        here rather than a call a start: a full pool makes a plan look at every start."""
        counts = self._firm if firm_only else self._counts
        step, size, capacity = self.step_us, len(counts), self.capacity
        for score, offset in starts:
            start = offset + shift
            first = start // step
            last = max(first + 1, -(-(start + span) // step))
            if max(counts[max(0, first) : min(size, last)], default=0) < capacity:
                return score, offset
        return None

    def least_loaded(self, offsets: Iterable[int], shift: int, span: int, *, firm_only: bool = False) -> int:
        """Of `offsets` (as `first_fit`'s), the one whose run has the lowest `peak_at`, the
        earliest on a tie."""
        counts = self._firm if firm_only else self._counts
        step, size = self.step_us, len(counts)
        least: tuple[int, int] | None = None
        for offset in offsets:
            start = offset + shift
            first = start // step
            last = max(first + 1, -(-(start + span) // step))
            here = (max(counts[max(0, first) : min(size, last)], default=0), offset)
            if least is None or here < least:
                least = here
        if least is None:
            raise ValueError("no offsets")
        return least[1]

    def fits_at(self, start: int, end: int, *, firm_only: bool = False) -> bool:
        """`fits` for [start, end) in microseconds since the anchor (see `shift`)."""
        return self.peak_at(start, end, firm_only=firm_only) < self.capacity

    def grid(self, earliest: datetime, latest: datetime) -> list[datetime]:
        first = -((self._anchor - earliest) // self._step)
        last = (latest - self._anchor) // self._step
        return [self._anchor + k * self._step for k in range(first, last + 1)]
