"""Adaptive concurrency limits across replicas (the algorithm: domain/adaptive.py).

Every replica tallies, in memory, what the ended attempts of adaptive types showed (from the
completer's batches and the leader's timeouts: no statement per attempt) and every window writes
its tallies in one statement. The leader then takes every replica's rows, moves each type's limit
and saves the limits in one statement; the other replicas read them back each window. Dispatch
reads `limits` from memory: an adaptive type at its limit goes into the claim's skip list as one
at its static limit does.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from lowtide.config import Config
from lowtide.errors import DatabaseUnavailable
from lowtide_proto.lowtide.v1 import scheduler_pb2
from scheduler_service.domain.adaptive import (
    AdaptiveSettings,
    LimitState,
    Tally,
    Window,
    classify,
    gather,
    initial_state,
    merge,
    next_limit,
    ready,
)
from scheduler_service.domain.model import Outcome
from scheduler_service.fleet.leadership import Leadership
from scheduler_service.rows.tasks import FinishedRow
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.adaptive")

# A window that has gathered this many windows without enough samples moves the limit anyway.
MAX_CARRIED = 10


def adaptive_settings(config: Config) -> dict[str, AdaptiveSettings]:
    """The adaptive types of the configuration, as the algorithm takes them."""
    out = {}
    for name, t in config.types.items():
        a = t.adaptive_concurrency
        if a is not None:
            out[name] = AdaptiveSettings(
                min=a.min,
                max=a.max,
                initial=a.initial,
                min_samples=a.min_samples,
                tolerance=a.tolerance,
                backoff=a.backoff,
                probe=a.probe,
            )
    return out


class AdaptiveLimits:
    def __init__(
        self,
        store: Store,
        *,
        settings: Mapping[str, AdaptiveSettings],
        scheduler_id: str,
        window: timedelta,
        leadership: Leadership,
        on_raised: Callable[[], None],
    ) -> None:
        self._store = store
        self.settings = dict(settings)
        self._scheduler_id = scheduler_id
        self._window = window.total_seconds()
        self._leadership = leadership
        self._on_raised = on_raised
        self.states: dict[str, LimitState] = {name: initial_state(s) for name, s in self.settings.items()}
        self.updated_at: dict[str, datetime] = {}
        self._tallies: dict[str, Tally] = {}
        self._since = datetime.now(UTC)
        # On the leader: windows too small to move their type's limit yet, and how many they span.
        self._carried: dict[str, tuple[Window, int]] = {}
        self.windows = 0

    @property
    def limits(self) -> dict[str, int]:
        """The limit each adaptive type's claims apply now."""
        return {name: state.value for name, state in self.states.items()}

    def record(self, outcomes: Iterable[tuple[Outcome, FinishedRow]]) -> None:
        """Tallies what applied outcomes of adaptive types say about their downstream."""
        if not self.settings:
            return
        for outcome, row in outcomes:
            if row.activity_type not in self.settings or row.run_time is None:
                continue
            failure = outcome.failure
            kind = classify(
                outcome.state.value if failure is None else "failed",
                failure.error_type if failure else None,
                failure.non_retryable if failure else None,
            )
            if kind is not None:
                tally = self._tallies.setdefault(row.activity_type, Tally())
                tally.add(kind, row.run_time.total_seconds() * 1000)

    async def run(self) -> None:
        if not self.settings:
            return
        loaded = False
        while True:
            try:
                if not loaded:
                    # A restart goes on from the stored limits, not from `initial`.
                    await self._load()
                    loaded = True
                await asyncio.sleep(self._window)
                await self.step()
                continue
            except DatabaseUnavailable as error:
                log.warning("adaptive.deferred", extra={"error": str(error)})
            except Exception:
                # Nothing may stop the limits for good: said, then tried again next window.
                log.exception("adaptive.step_failed")
            await asyncio.sleep(self._window)

    async def step(self, now: datetime | None = None) -> None:
        """One window: this replica's tallies written; the limits moved (leader) or read."""
        now = now or datetime.now(UTC)
        tallies, self._tallies = self._tallies, {}
        since, self._since = self._since, now
        try:
            await self._store.write_samples(self._scheduler_id, since, now, tallies)
        except DatabaseUnavailable:
            self._tallies = tallies  # written with the next window
            self._since = since
            raise
        self.windows += 1
        if self._leadership.leading:
            await self._move(now)
        else:
            await self._load()

    async def _move(self, now: datetime) -> None:
        # Rows older than a few windows (written while no replica led) describe another load.
        oldest = now - timedelta(seconds=self._window * MAX_CARRIED)
        windows = gather(r for r in await self._store.take_samples() if r.window_end >= oldest)
        moved: dict[str, LimitState] = {}
        for name, settings in self.settings.items():
            window = windows.get(name)
            carried, spans = self._carried.pop(name, (None, 0))
            if window is None and carried is None:
                continue
            if carried is not None:
                window = carried if window is None else merge(carried, window)
            assert window is not None
            if not ready(window, settings) and spans + 1 < MAX_CARRIED:
                self._carried[name] = (window, spans + 1)
                continue
            moved[name] = next_limit(self.states[name], window, settings, now)
        if moved:
            await self._store.save_limits(moved)
            self._apply(moved, dict.fromkeys(moved, now))

    async def _load(self) -> None:
        rows = await self._store.adaptive_limits()
        states = {
            r.activity_type: LimitState(
                limit=r.limit_value,
                baseline_ms=r.baseline_ms,
                baseline_at=r.baseline_at,
                latency_ms=r.latency_ms,
                failure_rate=r.failure_rate,
                samples=r.samples,
                reason=r.reason,
                slow_start=r.slow_start,
            )
            for r in rows
            if r.activity_type in self.settings
        }
        self._apply(states, {r.activity_type: r.updated_at for r in rows})

    def _apply(self, states: Mapping[str, LimitState], when: Mapping[str, datetime]) -> None:
        raised = False
        for name, stored in states.items():
            settings = self.settings[name]
            # A limit stored under other bounds (the configuration changed) is brought inside them.
            state = replace(stored, limit=min(settings.max, max(settings.min, stored.limit)))
            raised = raised or state.value > self.states[name].value
            if state.value != self.states[name].value:
                log.debug(
                    "adaptive.limit",
                    extra={"activity_type": name, "limit": state.value, "reason": state.reason},
                )
            self.states[name] = state
            self.updated_at[name] = when[name]
        if raised:
            self._on_raised()


async def adaptive_status(adaptive: AdaptiveLimits, store: Store) -> list[scheduler_pb2.AdaptiveLimitStatus]:
    """GetStatus's adaptive limits: each adaptive type's limit, bounds, running attempts and the
    figures of its last window (one query for the running counts)."""
    names = sorted(adaptive.settings)
    if not names:
        return []
    running = await store.running_by_type(names)
    out = []
    for name in names:
        state, settings = adaptive.states[name], adaptive.settings[name]
        status = scheduler_pb2.AdaptiveLimitStatus(
            activity_type=name,
            limit=state.value,
            min=settings.min,
            max=settings.max,
            running=running.get(name, 0),
            samples=state.samples,
            latency_seconds=math.nan if state.latency_ms is None else state.latency_ms / 1000,
            baseline_seconds=math.nan if state.baseline_ms is None else state.baseline_ms / 1000,
            failure_rate=state.failure_rate,
            reason=state.reason,
        )
        updated = adaptive.updated_at.get(name)
        if updated is not None:
            status.updated_at.FromDatetime(updated)
        out.append(status)
    return out


def adaptive_gauges(meter: Meter, adaptive: AdaptiveLimits) -> None:
    """Per adaptive type: its limit, and its last window's mean run time, baseline and failure
    share (read from memory at each collection)."""

    def gauge(read: Callable[[LimitState], float | None]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for name, state in adaptive.states.items():
                value = read(state)
                if value is not None:
                    yield Observation(value, {"activity_type": name})

        return observe

    def seconds(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000

    figures: list[tuple[str, str, str, Callable[[LimitState], float | None]]] = [
        ("lowtide.adaptive.limit", "{task}", "The adaptive concurrency limit claims apply", lambda s: s.value),
        (
            "lowtide.adaptive.latency",
            "s",
            "Mean run time of the last window's successful attempts",
            lambda s: seconds(s.latency_ms),
        ),
        (
            "lowtide.adaptive.baseline",
            "s",
            "The no-load run time latency is compared with",
            lambda s: seconds(s.baseline_ms),
        ),
        # Named with its unit's word, as lowtide.pool.fixed_start_hit_ratio.
        (
            "lowtide.adaptive.failure_ratio",
            "1",
            "Share of the last window's attempts that failed with a retryable error or timed out",
            lambda s: s.failure_rate,
        ),
    ]
    for name, unit, description, read in figures:
        meter.create_observable_gauge(name, callbacks=[gauge(read)], unit=unit, description=description)
