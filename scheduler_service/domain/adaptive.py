"""The adaptive concurrency limit of an activity type: TCP Vegas, as Netflix's concurrency-limits
library has it (VegasLimit behind a WindowedLimit), with a multiplicative decrease on failures.

Why it works this way: docs/architecture/dispatch.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class AdaptiveSettings:
    """`[types.NAME] adaptive_concurrency = { ... }` of one type."""

    min: int = 1
    max: int = 200
    # Where a type starts before it has any state: min unless set (a new type never bursts).
    initial: int | None = None
    # A window needs this many attempts to move the limit (fewer gather into the next window).
    min_samples: int = 10
    # A failure rate up to this is noise, not overload.
    tolerance: float = 0.02
    # On failures the limit falls at least to limit x backoff.
    backoff: float = 0.9
    # The no-load baseline is measured again this often (the downstream may have changed).
    probe: timedelta = timedelta(minutes=1)

    @property
    def start(self) -> int:
        return self.min if self.initial is None else self.initial


@dataclass(frozen=True, slots=True)
class Window:
    """What a type's attempts showed since the limit last moved."""

    # Attempts that ended: succeeded + failed + timed_out.
    samples: int = 0
    succeeded: int = 0
    # Failed with an error the worker reported as retryable.
    failed: int = 0
    # Ran past their start_to_close or heartbeat timeout.
    timed_out: int = 0
    # Mean run time of the attempts that succeeded, in ms (None: none succeeded).
    latency_ms: float | None = None
    # Mean number of the type's attempts running during the window (Little's law).
    in_flight: float = 0.0

    @property
    def failure_rate(self) -> float:
        return (self.failed + self.timed_out) / self.samples if self.samples else 0.0


@dataclass(frozen=True, slots=True)
class LimitState:
    """The limit of a type as the leader keeps it (in lowtide.adaptive_limits)."""

    limit: float
    baseline_ms: float | None = None
    baseline_at: datetime | None = None
    # The figures of the last window that moved (or kept) the limit, for status and metrics.
    latency_ms: float | None = None
    failure_rate: float = 0.0
    samples: int = 0
    reason: str = "not yet measured"
    # Until the first decrease the limit climbs fast (6L a window while nothing queues), after
    # it by L: the knee, once found, is approached gently.
    slow_start: bool = True

    @property
    def value(self) -> int:
        """The limit the claim applies: whole tasks."""
        return max(1, math.floor(self.limit))


def initial_state(settings: AdaptiveSettings) -> LimitState:
    return LimitState(limit=float(clamp(settings.start, settings)))


def clamp(limit: float, settings: AdaptiveSettings) -> float:
    return float(min(settings.max, max(settings.min, limit)))


def _log10(limit: float) -> int:
    return max(1, int(math.log10(max(1.0, limit))))


def ready(window: Window, settings: AdaptiveSettings) -> bool:
    """Whether the window has enough attempts to move the limit."""
    return window.samples >= settings.min_samples


def next_limit(state: LimitState, window: Window, settings: AdaptiveSettings, now: datetime) -> LimitState:
    """The state after one window (which `ready` said has enough samples)."""
    limit = clamp(state.limit, settings)
    rate = window.failure_rate
    seen = replace(state, latency_ms=window.latency_ms, failure_rate=rate, samples=window.samples)
    if rate > settings.tolerance:
        factor = max(0.5, min(settings.backoff, 1.0 - rate))
        reason = f"{rate:.0%} of {window.samples} attempts failed or timed out"
        return replace(seen, limit=clamp(limit * factor, settings), reason=reason, slow_start=False)
    if window.latency_ms is None:
        return replace(seen, limit=limit, reason="no attempt succeeded")
    baseline, baseline_at = _baseline(state, window.latency_ms, settings, now)
    seen = replace(seen, baseline_ms=baseline, baseline_at=baseline_at)
    if window.in_flight * 2 < limit:
        return replace(seen, limit=limit, reason=f"demand-limited ({window.in_flight:.1f} in flight)")
    queue = limit * (1.0 - baseline / window.latency_ms) if window.latency_ms > 0 else 0.0
    step = _log10(limit)
    if queue <= step and state.slow_start:
        moved, reason = limit + 6 * step, "healthy: run time at its baseline (slow start)"
    elif queue <= step:
        moved, reason = limit + step, "healthy: run time at its baseline"
    elif queue < 3 * step:
        moved, reason = limit + step, "healthy: little queueing downstream"
    elif queue > 6 * step:
        moved, reason = limit - step, f"run time {window.latency_ms / baseline:.2f}x its baseline"
        seen = replace(seen, slow_start=False)
    else:
        moved, reason = limit, "settled"
    return replace(seen, limit=clamp(moved, settings), reason=reason)


def _baseline(
    state: LimitState, latency_ms: float, settings: AdaptiveSettings, now: datetime
) -> tuple[float, datetime]:
    """The no-load run time: the least window mean seen since the last probe."""
    if state.baseline_ms is None or state.baseline_at is None or now - state.baseline_at >= settings.probe:
        return latency_ms, now
    return min(state.baseline_ms, latency_ms), state.baseline_at


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One replica's figures for one type over one stretch of time (lowtide.adaptive_samples)."""

    scheduler_id: str
    activity_type: str
    window_start: datetime
    window_end: datetime
    succeeded: int
    failed: int
    timed_out: int
    # Run time summed over every attempt, and over those that succeeded, in ms.
    run_ms: float
    ok_run_ms: float


def gather(rows: Iterable[SampleRow]) -> dict[str, Window]:
    """The windows of each type from the rows of every replica. In-flight is each replica's run
    time over the time its rows cover, summed over replicas."""
    totals: dict[str, list[float]] = {}
    covered: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        t = totals.setdefault(row.activity_type, [0, 0, 0, 0.0])
        t[0] += row.succeeded
        t[1] += row.failed
        t[2] += row.timed_out
        t[3] += row.ok_run_ms
        spent = covered.setdefault((row.activity_type, row.scheduler_id), [0.0, 0.0])
        spent[0] += row.run_ms
        spent[1] += max(0.001, (row.window_end - row.window_start).total_seconds() * 1000)
    in_flight: dict[str, float] = {}
    for (name, _), (run_ms, span_ms) in covered.items():
        in_flight[name] = in_flight.get(name, 0.0) + run_ms / span_ms
    windows = {}
    for name, (ok, failed, timed_out, ok_ms) in totals.items():
        windows[name] = Window(
            samples=int(ok + failed + timed_out),
            succeeded=int(ok),
            failed=int(failed),
            timed_out=int(timed_out),
            latency_ms=ok_ms / ok if ok else None,
            in_flight=in_flight.get(name, 0.0),
        )
    return windows


def merge(a: Window, b: Window) -> Window:
    """Two windows of a type as one (a window too small to move the limit waits for the next)."""
    ok = a.succeeded + b.succeeded
    ok_ms = (a.latency_ms or 0.0) * a.succeeded + (b.latency_ms or 0.0) * b.succeeded
    weight = a.samples + b.samples
    return Window(
        samples=a.samples + b.samples,
        succeeded=ok,
        failed=a.failed + b.failed,
        timed_out=a.timed_out + b.timed_out,
        latency_ms=ok_ms / ok if ok else None,
        in_flight=(a.in_flight * a.samples + b.in_flight * b.samples) / weight if weight else 0.0,
    )


# What an ended attempt tells the limit: ok, failed (retryable, so perhaps overload) or
# timed_out; None for what says nothing about the downstream (a non-retryable error, a lost
# worker, a cancel).
_TIMEOUTS = frozenset({"StartToCloseTimeout", "HeartbeatTimeout"})


def classify(state: str, error_type: str | None, non_retryable: bool | None) -> str | None:
    if state == "completed":
        return "ok"
    if error_type is None:
        return None
    if error_type in _TIMEOUTS:
        return "timed_out"
    if non_retryable or error_type == "WorkerLost":
        return None
    return "failed"


@dataclass(slots=True)
class Tally:
    """One replica's figures for one type since its last flush (becomes a SampleRow)."""

    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    run_ms: float = 0.0
    ok_run_ms: float = 0.0

    def add(self, kind: str, run_ms: float) -> None:
        self.run_ms += run_ms
        if kind == "ok":
            self.succeeded += 1
            self.ok_run_ms += run_ms
        elif kind == "failed":
            self.failed += 1
        else:
            self.timed_out += 1
