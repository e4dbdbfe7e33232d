"""Wake-ups that wait: dispatch references parked while every type they name is held (rechecked
after hold_recheck, released when the hold ends), and timers that wake groups when work falls due
(a retry's backoff, a planned release, a latest start), shared per 10 ms."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from scheduler_service.domain.dispatch import GroupKey
from scheduler_service.fleet.sessions import Registry, WorkerSession

# Per queue, the types held for a group's workers now (Dispatcher.held_map).
HeldMap = Callable[[GroupKey], dict[str, frozenset[str]]]


class HeldReferences:
    """Dispatch references (wake-ups naming new tasks) that named only held types, per worker:
    each is rechecked after hold_recheck, or released at once when the hold ends. Made before
    the cost hold (which releases them) and the dispatcher (which parks them)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self.entries: dict[str, tuple[asyncio.TimerHandle, set[tuple[str, str]]]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def release(self) -> None:
        """The hold ended: every parked reference goes back at once, and every group is woken."""
        for handle, _ in self.entries.values():
            handle.cancel()
        self.entries.clear()
        self._registry.wake_all()

    def park(self, session: WorkerSession, pairs: list[tuple[str, str]], recheck: float, held_map: HeldMap) -> None:
        parked = self.entries.get(session.worker_id)
        if parked is not None:
            parked[1].update(pairs)
            return
        loop = asyncio.get_running_loop()
        handle = loop.call_later(recheck, self._recheck, session, recheck, held_map)
        self.entries[session.worker_id] = (handle, set(pairs))

    def _recheck(self, session: WorkerSession, recheck: float, held_map: HeldMap) -> None:
        """hold_recheck passed: the reference goes back to dispatch (which also takes held tasks
        past their max_defer); if its types are still held it is parked again."""
        _, pairs = self.entries.pop(session.worker_id, (None, set()))
        if session.closed:
            return
        session.wake.set()
        held = held_map(session.key())
        if pairs and all(t in held.get(q, frozenset()) for q, t in pairs):
            self.park(session, sorted(pairs), recheck, held_map)


class WakeTimers:
    """Timers that wake groups at a given time, one per 10 ms bucket, each with the (queue, type)
    pairs it wakes for (None: every group)."""

    def __init__(self, registry: Registry, wake_for: Callable[[Iterable[tuple[str, str]]], None]) -> None:
        self._registry = registry
        self._wake_for = wake_for
        self._timers: dict[int, set[tuple[str, str]] | None] = {}

    def wake_at(self, when: datetime, pairs: Iterable[tuple[str, str]] | None = None) -> None:
        bucket = int(when.timestamp() * 100)
        if bucket in self._timers:
            named = self._timers[bucket]
            if named is not None:
                if pairs is None:
                    self._timers[bucket] = None
                else:
                    named.update(pairs)
            return
        delay = max(0.0, (when - datetime.now(UTC)).total_seconds())
        loop = asyncio.get_running_loop()

        def fire() -> None:
            named = self._timers.pop(bucket, None)
            if named is None:
                self._registry.wake_all()
            else:
                self._wake_for(named)

        self._timers[bucket] = None if pairs is None else set(pairs)
        loop.call_later(delay, fire)
