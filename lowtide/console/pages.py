"""What the pages show, prepared from the services' answers: the charts' points and the
sentences that tell what is going on (the story the overview opens with). Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lowtide.console import charts, forecast
from lowtide.console.backend import HISTORY, Overview, TaskStory
from lowtide_proto.lowtide.v1 import scheduler_pb2, signal_pb2, task_pb2

# Reservations drawn on the pools page at most.
MAX_BARS = 40


def seconds(stamp: Any) -> float:
    return float(stamp.seconds) + float(stamp.nanos) / 1e9


def when(stamp: Any) -> str:
    """A timestamp field as the pages show it, or an empty string when unset."""
    if stamp is None or (stamp.seconds == 0 and stamp.nanos == 0):
        return ""
    return datetime.fromtimestamp(seconds(stamp), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def state_name(state: int) -> str:
    return str(task_pb2.TaskState.Name(state)).removeprefix("TASK_STATE_").lower()  # type: ignore[arg-type]


def releases(tasks: list[task_pb2.Task]) -> list[charts.Release]:
    return [
        charts.Release(
            task_id=t.id,
            at=seconds(t.planned_release_at),
            intensity=t.planned_intensity if t.HasField("planned_intensity") else None,
        )
        for t in tasks
        if t.HasField("planned_release_at") and t.planned_release_at.seconds > 0
    ]


def on_default_signal(view: Overview) -> list[task_pb2.Task]:
    """The pending tasks planned on the default signal: not those the plan placed in a pool bound
    to another signal (a region, drawn on its own signal's chart)."""
    elsewhere = {p.name for p in view.status.pools if p.signal and p.signal != view.status.hold.signal}
    return [t for t in view.pending if t.planned_pool not in elsewhere]


def errors(points: Sequence[signal_pb2.SignalPoint]) -> list[tuple[float | None, str]]:
    """Each forecast point's expected error (None when it states none) and where it comes from."""
    return [(p.expected_error if p.HasField("expected_error") else None, p.error_source) for p in points]


def signal_svg(view: Overview) -> str:
    now = view.now.timestamp()
    return charts.signal_chart(
        history=[(seconds(p.at), p.value) for p in view.history],
        forecast=[(seconds(p.at), p.value) for p in view.forecast],
        threshold=view.status.hold.threshold,
        now=now,
        since=now - HISTORY.total_seconds(),
        releases=releases(on_default_signal(view)),
        unit=view.signal.unit,
        errors=errors(view.forecast),
    )


def forecast_note(view: Overview) -> list[str]:
    """The default signal's forecast in sentences: issued when, how sure, the error's source, and
    how the values that came since compare with it."""
    points = [
        forecast.Point(seconds(p.at), p.value, error, source, p.bias if p.HasField("bias") else None)
        for p, (error, source) in zip(view.forecast, errors(view.forecast), strict=True)
    ]
    return forecast.note(
        points,
        issued_at=view.forecast_issued_at,
        source=view.forecast_source,
        history=[(seconds(p.at), p.value) for p in view.history],
        now=view.now.timestamp(),
    )


def other_signal_svgs(view: Overview) -> dict[str, str]:
    """Each other signal's chart: its history, forecast and threshold, in its unit."""
    now = view.now.timestamp()
    return {
        other.signal.name: charts.signal_chart(
            history=[(seconds(p.at), p.value) for p in other.history],
            forecast=[(seconds(p.at), p.value) for p in other.forecast],
            threshold=other.signal.threshold,
            now=now,
            since=now - HISTORY.total_seconds(),
            releases=[],
            unit=other.signal.unit,
            errors=errors(other.forecast),
        )
        for other in view.others
    }


def queue_svgs(view: Overview) -> dict[str, str]:
    return {
        name: charts.lines_chart(
            {
                "depth": [(s.at, float(s.depth)) for s in samples],
                "held": [(s.at, float(s.held)) for s in samples],
                "running": [(s.at, float(s.running)) for s in samples],
            },
            label=f"queue {name}: claimable, held and running over time",
        )
        for name, samples in sorted(view.samples.items())[:12]
    }


@dataclass(frozen=True)
class Carbon:
    activity_type: str
    tasks: int
    at_submit: float
    at_dispatch: float

    @property
    def saved(self) -> float:
        return self.at_submit - self.at_dispatch

    @property
    def saved_share(self) -> float:
        return self.saved / self.at_submit * 100 if self.at_submit > 0 else 0.0


def carbon(status: scheduler_pb2.GetStatusResponse) -> list[Carbon]:
    return [
        Carbon(c.activity_type, c.tasks, c.mean_at_submit, c.mean_at_dispatch)
        for c in status.carbon
        if math.isfinite(c.mean_at_submit) and math.isfinite(c.mean_at_dispatch)
    ]


def story(view: Overview) -> list[str]:
    """What is happening, in sentences: the signal and the hold, what is held and when it goes."""
    hold = view.status.hold
    unit = view.signal.unit or ""
    held = sum(q.held_depth for q in view.status.queues)
    running = sum(q.running for q in view.status.queues)
    lines: list[str] = []
    if not hold.HasField("value"):
        lines.append(f"No value of signal {hold.signal or 'default'} yet: until one arrives the signal counts as high.")
    elif hold.active:
        types = sorted({t for q in view.status.queues for t in q.held_types})
        held_what = f" {', '.join(types)}" if types else ""
        lines.append(
            f"The signal is HIGH: {hold.value:g} {unit} is above the threshold of {hold.threshold:g}, "
            f"so cost-deferrable work{held_what} is held"
            + (f" (since {when(hold.since)})." if hold.HasField("since") else ".")
        )
    else:
        lines.append(
            f"The signal is low: {hold.value:g} {unit} is at or under the threshold of {hold.threshold:g}, "
            "so held work is released and runs now."
        )
    plans = sorted(releases(on_default_signal(view)), key=lambda r: r.at)
    placed = len(releases(view.pending)) - len(plans)
    if held:
        lines.append(f"{held} task(s) wait for a lower signal; {running} running.")
    else:
        lines.append(f"Nothing waits for a lower signal; {running} task(s) running.")
    if plans:
        lines.append(
            f"{len(plans)} task(s) have a planned release, in the forecast's cheapest window before their "
            f"latest start: the first at {when_seconds(plans[0].at)}."
        )
    if placed:
        lines.append(
            f"{placed} task(s) placed in a pool bound to another signal, released there as planned: see Regions."
        )
    for c in carbon(view.status):
        if c.tasks and c.saved > 0:
            lines.append(
                f"{c.activity_type}: {c.tasks} task(s) ran at {c.at_dispatch:.0f} {unit} on average instead of "
                f"{c.at_submit:.0f} when submitted: {c.saved:.0f} ({c.saved_share:.0f}%) less by waiting."
            )
    return lines


def when_seconds(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC")


def reservation_bars(tasks: list[task_pb2.Task]) -> list[charts.Bar]:
    bars = []
    for t in tasks:
        if not t.HasField("start_at") or t.start_at.seconds == 0:
            continue
        start = seconds(t.start_at)
        tolerance = t.start_tolerance.seconds + t.start_tolerance.nanos / 1e9
        duration = t.estimated_duration.seconds + t.estimated_duration.nanos / 1e9
        label = f"#{t.id} {t.activity_type} ({t.pool or 'default'}) {when_seconds(start)}"
        bars.append(charts.Bar(label=label, low=start - tolerance, start=start, high=start + duration + tolerance))
    return sorted(bars, key=lambda b: b.start)[:MAX_BARS]


def task_svg(story: TaskStory, now: float) -> str:
    """The forecast the task's plan came from, with its planned release marked."""
    if not story.forecast:
        return '<p class="empty">No forecast: the signal\'s feed gives none.</p>'
    return charts.signal_chart(
        history=[],
        forecast=[(seconds(p.at), p.value) for p in story.forecast],
        threshold=story.threshold,
        now=now,
        since=now - 3600,
        releases=releases([story.task]),
        errors=errors(story.forecast),
    )
