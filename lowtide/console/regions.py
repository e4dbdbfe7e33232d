"""Where work runs, as the overview shows it: each pool bound to a signal (a region: `[pools.NAME]
signal`) with its signal's value against its threshold, its connected workers and slots, and the
held tasks the plan placed there with when each is to be released. Pure functions of the
services' answers (GetStatus, the pending tasks, the signals' states, histories and forecasts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lowtide.console import charts
from lowtide.console.backend import HISTORY, Overview, SignalView
from lowtide_proto.lowtide.v1 import scheduler_pb2, task_pb2

# Planned releases listed under a region's chart at most (the count is the scheduler's own).
MAX_LISTED = 20


@dataclass(frozen=True)
class Region:
    pool: str
    signal: str
    # The pool's signal's value now as the scheduler plans on it (None before its first value).
    value: float | None
    unit: str
    # None when the console does not read that signal (more signals than it draws).
    threshold: float | None
    workers: int
    slots: int
    busy_slots: int
    # Held tasks placed in this pool and not released yet (PoolStatus.planned_releases).
    planned: int
    # Those of them among the pending tasks read, soonest first.
    releases: list[charts.Release] = field(default_factory=list)
    svg: str = ""
    # The soonest of all of them (PoolStatus.next_release_*, the scheduler's own, however many
    # are pending); None when the scheduler names none.
    next: charts.Release | None = None


def _seconds(stamp: object) -> float:
    return float(stamp.seconds) + float(stamp.nanos) / 1e9  # type: ignore[attr-defined]


def placed_in(tasks: Sequence[task_pb2.Task], pool: str) -> list[charts.Release]:
    """The tasks the plan placed in `pool` with a planned release, soonest first."""
    return sorted(
        (
            charts.Release(
                task_id=t.id,
                at=_seconds(t.planned_release_at),
                intensity=t.planned_intensity if t.HasField("planned_intensity") else None,
            )
            for t in tasks
            if t.planned_pool == pool and t.HasField("planned_release_at") and t.planned_release_at.seconds > 0
        ),
        key=lambda r: r.at,
    )


def next_release(pool: scheduler_pb2.PoolStatus) -> charts.Release | None:
    """The soonest planned release in the pool, as the scheduler counts them all."""
    if not pool.next_release_task_id:
        return None
    intensity = pool.next_release_intensity if pool.HasField("next_release_intensity") else None
    return charts.Release(task_id=pool.next_release_task_id, at=_seconds(pool.next_release_at), intensity=intensity)


def regions(
    status: scheduler_pb2.GetStatusResponse,
    pending: Sequence[task_pb2.Task],
    signals: Mapping[str, SignalView],
    *,
    now: float,
) -> list[Region]:
    """Each pool bound to a signal, by name, with its chart when its signal is read (history and
    forecast, the threshold, and the pool's planned releases marked)."""
    found = []
    for pool in sorted(status.pools, key=lambda p: p.name):
        if not pool.signal:
            continue
        view = signals.get(pool.signal)
        releases = placed_in(pending, pool.name)
        svg = ""
        if view is not None:
            svg = charts.signal_chart(
                history=[(_seconds(p.at), p.value) for p in view.history],
                forecast=[(_seconds(p.at), p.value) for p in view.forecast],
                threshold=view.signal.threshold,
                now=now,
                since=now - HISTORY.total_seconds(),
                releases=releases,
                unit=view.signal.unit,
                errors=[
                    (p.expected_error if p.HasField("expected_error") else None, p.error_source) for p in view.forecast
                ],
            )
        found.append(
            Region(
                pool=pool.name,
                signal=pool.signal,
                value=pool.signal_value if pool.HasField("signal_value") else None,
                unit=view.signal.unit if view is not None else "",
                threshold=view.signal.threshold if view is not None else None,
                workers=pool.workers,
                slots=pool.slots,
                busy_slots=pool.busy_slots,
                planned=pool.planned_releases,
                releases=releases,
                svg=svg,
                next=next_release(pool),
            )
        )
    return found


def of_overview(view: Overview) -> list[Region]:
    """The regions of the overview: the default signal and every other one it read."""
    signals = {v.signal.name: v for v in view.others}
    signals[view.status.hold.signal] = SignalView(view.signal, view.history, view.forecast)
    return regions(view.status, view.pending, signals, now=view.now.timestamp())


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC")


def signal_line(region: Region) -> str:
    """Its signal now against its threshold."""
    unit = f" {region.unit}" if region.unit else ""
    if region.value is None:
        return f"Signal {region.signal}: no value yet."
    if region.threshold is None:
        return f"Signal {region.signal}: {region.value:g}{unit}."
    side = "above" if region.value > region.threshold else "at or under"
    return f"Signal {region.signal}: {region.value:g}{unit}, {side} its threshold of {region.threshold:g}."


def workers_line(region: Region) -> str:
    if not region.workers:
        return "No worker connected: the plan places nothing here until one connects."
    return f"{region.workers} worker(s) connected, {region.busy_slots} of {region.slots} slot(s) busy."


def releases_line(region: Region) -> str:
    """How many held tasks are to be released here, and the next one (the scheduler's, else the
    soonest among the pending tasks read)."""
    if not region.planned and not region.releases:
        return "No held task is planned to be released here."
    count = max(region.planned, len(region.releases))
    line = f"{count} held task(s) planned to be released here"
    first = region.next or (region.releases[0] if region.releases else None)
    if first is None:
        return line + "."
    forecast = f", forecast {first.intensity:.0f}" if first.intensity is not None else ""
    return line + f": the next at {_clock(first.at)} (task {first.task_id}{forecast})."


def listed(region: Region) -> list[tuple[int, str, str]]:
    """The planned releases listed under the chart: task, time, forecast mean then."""
    return [
        (r.task_id, _clock(r.at), f"{r.intensity:.0f}" if r.intensity is not None else "")
        for r in region.releases[:MAX_LISTED]
    ]
