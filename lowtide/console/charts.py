"""The console's charts, drawn on the server as inline SVG: no JavaScript chart library, nothing
fetched by the browser, and a page that shows its charts with scripts off. Pure functions of
the numbers they draw (times in Unix seconds); every label is escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

WIDTH, HEIGHT = 800, 260
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 28


@dataclass(frozen=True)
class Release:
    """A held task's planned release: when, and the forecast mean the planner expects then."""

    task_id: int
    at: float
    intensity: float | None


@dataclass(frozen=True)
class Bar:
    """One reservation on the timeline: its window and the start it promises."""

    label: str
    low: float
    start: float
    high: float


class _Frame:
    def __init__(self, x0: float, x1: float, y0: float, y1: float, height: int = HEIGHT) -> None:
        self.x0, self.x1 = x0, max(x1, x0 + 1)
        self.y0, self.y1 = y0, max(y1, y0 + 1)
        self.height = height

    def x(self, t: float) -> float:
        return round(LEFT + (t - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT), 1)

    def y(self, v: float) -> float:
        # A value off the chart (see value_span) is drawn at its edge, not past the frame.
        v = min(max(v, self.y0), self.y1)
        return round(self.height - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (self.height - TOP - BOTTOM), 1)


# How far past the bulk of the values the axis reaches: the quartiles' spread (or the median, or
# the threshold, when those are wider) this many times over. Real peaks fit; a value a typo or a
# broken feed left in the history (1e308) does not flatten everything else to a line on the axis.
REACH = 6.0


def _quantile(ordered: Sequence[float], q: float) -> float:
    position = (len(ordered) - 1) * q
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def value_span(values: Sequence[float], threshold: float) -> tuple[float, float]:
    """The value axis of a signal chart: from 0 (or the lowest value, when negative: a price) to
    a little over the highest, each end no further than REACH spreads past the quartiles."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if not ordered:
        return 0.0, max(threshold * 1.1, 1.0)
    q1, median, q3 = (_quantile(ordered, q) for q in (0.25, 0.5, 0.75))
    spread = max(q3 - q1, abs(median), abs(threshold), 1.0)
    low = min(max(ordered[0], q1 - REACH * spread), threshold, 0.0)
    high = max(min(ordered[-1], q3 + REACH * spread), threshold)
    pad = (high - low) * 0.1
    return (low - pad if low < 0 else low), high + pad


def _tick(value: float, span: float) -> str:
    """An axis label short enough for the margin: 1,250 or 0.25 or 3.1e+06."""
    if abs(value) >= 1e5:
        return f"{value:.2g}"
    return f"{value:,.{0 if span >= 10 else 1 if span >= 1 else 2}f}"


def _clock(t: float, span: float) -> str:
    """A time on an axis spanning `span` seconds: with the day over a day, seconds under 10 min."""
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%a %H:%M" if span > 86400 else "%H:%M:%S" if span < 600 else "%H:%M")


def _axes(frame: _Frame, unit: str) -> list[str]:
    parts = [f'<line class="axis" x1="{LEFT}" y1="{frame.y(frame.y0)}" x2="{WIDTH - RIGHT}" y2="{frame.y(frame.y0)}"/>']
    for i in range(5):
        value = frame.y0 + (frame.y1 - frame.y0) * i / 4
        y = frame.y(value)
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}"/>')
        label = _tick(value, frame.y1 - frame.y0)
        parts.append(f'<text class="tick" x="{LEFT - 4}" y="{y + 4}" text-anchor="end">{label}</text>')
    span = frame.x1 - frame.x0
    for i in range(6):
        t = frame.x0 + span * i / 5
        anchor = "start" if i == 0 else "end" if i == 5 else "middle"
        parts.append(
            f'<text class="tick" x="{frame.x(t)}" y="{frame.height - 8}" text-anchor="{anchor}">'
            f"{_clock(t, span)}</text>"
        )
    if unit:
        parts.append(f'<text class="tick" x="{LEFT + 4}" y="{TOP + 10}">{escape(unit)}</text>')
    return parts


def _svg(label: str, parts: Sequence[str], height: int = HEIGHT, css: str = "chart") -> str:
    return (
        f'<svg class="{css}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(label)}" '
        f'preserveAspectRatio="none">{"".join(parts)}</svg>'
    )


def _steps(points: Sequence[tuple[float, float]], frame: _Frame, until: float) -> str:
    """A step line: each value holds until the next (a signal is a level, not a slope)."""
    coords: list[str] = []
    for i, (t, v) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else until
        coords += [f"{frame.x(t)},{frame.y(v)}", f"{frame.x(end)},{frame.y(v)}"]
    return " ".join(coords)


def _high_spans(points: Sequence[tuple[float, float]], threshold: float, until: float) -> list[tuple[float, float]]:
    spans: list[tuple[float, float]] = []
    for i, (t, v) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else until
        if v > threshold:
            if spans and math.isclose(spans[-1][1], t):
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((t, end))
    return spans


def signal_chart(
    *,
    history: Sequence[tuple[float, float]],
    forecast: Sequence[tuple[float, float]],
    threshold: float,
    now: float,
    since: float,
    releases: Sequence[Release] = (),
    unit: str = "",
    errors: Sequence[tuple[float | None, str]] = (),
) -> str:
    """The signal against its threshold: history (step line) from `since` to `now`, the hold's
    periods shaded, the forecast (dashed) as it was issued, from its first point (so the part of
    it already past lies beside the values that came), its error band (`errors`: each point's
    expected relative error and where it comes from; ±error around the value), and each planned
    release as a marker."""
    history = [(max(t, since), v) for t, v in history if t <= now]
    # From the oldest value kept (at most `since`): a young signal, or a replay at a day per
    # minute, fills the chart instead of a sliver at its right edge.
    start = min(max(since, history[0][0]), now - 60) if history else since
    bands = [*errors][: len(forecast)] + [(None, "")] * (len(forecast) - len(errors))
    step = forecast[-1][0] - forecast[-2][0] if len(forecast) > 1 else 0.0
    # The forecast's points on the chart: those whose interval ends after its start.
    shown = [
        i for i, (t, _) in enumerate(forecast) if (forecast[i + 1][0] if i + 1 < len(forecast) else t + step) > start
    ]
    drawn = [(max(forecast[i][0], start), forecast[i][1]) for i in shown]
    drawn_bands = [bands[i] for i in shown]
    ahead = [*(t for t, _ in drawn), *(r.at for r in releases), *([drawn[-1][0] + step] if drawn else [])]
    end = max([now + (now - start) * 0.05, *ahead])
    end += (end - start) * 0.02
    values = [v for _, v in (*history, *drawn)] + [r.intensity for r in releases if r.intensity]
    values += [v * (1 + s * e) for (_, v), (e, _) in zip(drawn, drawn_bands, strict=True) if e for s in (-1, 1)]
    frame = _Frame(start, end, *value_span(values, threshold))
    parts = [
        f'<rect class="hold" x="{frame.x(a)}" y="{TOP}" width="{max(frame.x(b) - frame.x(a), 1)}" '
        f'height="{HEIGHT - TOP - BOTTOM}"><title>hold: signal above {threshold:g}</title></rect>'
        for a, b in _high_spans(history, threshold, now)
    ]
    ahead_only = [(max(t, now), v) for i, (t, v) in enumerate(drawn) if i + 1 == len(drawn) or drawn[i + 1][0] > now]
    parts += [
        f'<rect class="forecast-high" x="{frame.x(a)}" y="{TOP}" width="{max(frame.x(b) - frame.x(a), 1)}" '
        f'height="{HEIGHT - TOP - BOTTOM}"/>'
        for a, b in _high_spans(ahead_only, threshold, drawn[-1][0] + step if drawn else now)
    ]
    parts += _axes(frame, unit)
    parts += _band(drawn, drawn_bands, frame, drawn[-1][0] + step if drawn else now)
    ty = frame.y(threshold)
    parts.append(
        f'<line class="threshold-line" x1="{LEFT}" y1="{ty}" x2="{WIDTH - RIGHT}" y2="{ty}">'
        f"<title>threshold {threshold:g}</title></line>"
    )
    if history:
        parts.append(
            f'<polyline class="signal-line" points="{_steps(history, frame, now)}"><title>signal</title></polyline>'
        )
    if drawn:
        ahead_line = _steps(drawn, frame, drawn[-1][0] + step)
        parts.append(
            f'<polyline class="forecast-line" points="{ahead_line}"><title>forecast, as issued</title></polyline>'
        )
    parts.append(f'<line class="now" x1="{frame.x(now)}" y1="{TOP}" x2="{frame.x(now)}" y2="{frame.y(frame.y0)}"/>')
    parts += _off_the_chart(values, frame)
    for release in releases[:300]:
        x = frame.x(release.at)
        y = frame.y(release.intensity if release.intensity is not None else threshold)
        parts.append(
            f'<g class="planned-release" data-task="{release.task_id}"><line x1="{x}" y1="{TOP}" x2="{x}" '
            f'y2="{frame.y(0)}"/><circle cx="{x}" cy="{y}" r="5"/><title>task {release.task_id}: planned release '
            f"{_clock(release.at, 86401)} UTC</title></g>"
        )
    return _svg("signal, threshold, forecast with its error band, and planned releases", parts)


def _band(
    points: Sequence[tuple[float, float]], bands: Sequence[tuple[float | None, str]], frame: _Frame, until: float
) -> list[str]:
    """Each forecast point's expected error as a shaded box, ±error around its value over its
    interval, titled with the numbers and where the error comes from."""
    parts = []
    for i, ((t, v), (error, source)) in enumerate(zip(points, bands, strict=True)):
        if error is None or not math.isfinite(error):
            continue
        end = points[i + 1][0] if i + 1 < len(points) else until
        top, bottom = frame.y(v + abs(v) * error), frame.y(v - abs(v) * error)
        where = f"; {escape(source)}" if source else ""
        parts.append(
            f'<rect class="forecast-band" x="{frame.x(t)}" y="{top}" width="{max(frame.x(end) - frame.x(t), 0.5)}" '
            f'height="{max(bottom - top, 0.5)}" data-value="{v:g}" data-error="{error:g}">'
            f"<title>{_clock(t, 86401)} UTC: {v:.4g} ± {abs(v) * error:.3g} ({error:.0%}{where})</title></rect>"
        )
    return parts


def _off_the_chart(values: Sequence[float], frame: _Frame) -> list[str]:
    """A note, top right, when values lie past the axis (drawn at its edge): how many, how far."""
    above = [v for v in values if v > frame.y1]
    below = [v for v in values if v < frame.y0]
    notes = [f"{len(above)} value(s) above the chart, up to {max(above):.3g}"] if above else []
    notes += [f"{len(below)} value(s) below the chart, down to {min(below):.3g}"] if below else []
    return [
        f'<text class="tick clipped" x="{WIDTH - RIGHT - 4}" y="{TOP + 10 + 14 * i}" text-anchor="end">'
        f"{escape(note)}</text>"
        for i, note in enumerate(notes)
    ]


def lines_chart(series: dict[str, Sequence[tuple[float, float]]], *, label: str, height: int = 160) -> str:
    """Several lines over the same time, each with its CSS class (`depth`, `held`, `running`)."""
    points = [p for line in series.values() for p in line]
    if not points:
        return '<p class="empty">No samples yet: they are taken while a page is open.</p>'
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    frame = _Frame(t0, max(t1, t0 + 60), 0.0, max(max(v for _, v in points) * 1.1, 1.0), height)
    parts = _axes(frame, "")
    for name, line in series.items():
        coords = " ".join(f"{frame.x(t)},{frame.y(v)}" for t, v in line)
        parts.append(f'<polyline class="{escape(name)}" points="{coords}"><title>{escape(name)}</title></polyline>')
        if line:
            t, v = line[-1]
            parts.append(f'<circle class="{escape(name)}" cx="{frame.x(t)}" cy="{frame.y(v)}" r="3"/>')
    return _svg(label, parts, height)


def slots_bar(busy: int, held: int, total: int) -> str:
    """One pool's slots as a bar: busy, held for reservations, free."""
    total = max(total, busy + held, 1)
    free = total - busy - held
    x = 0.0
    parts = []
    for css, count in (("busy", busy), ("held", held), ("free", free)):
        width = count / total * 100
        parts.append(
            f'<rect class="{css}" x="{x:.2f}" y="0" width="{width:.2f}" height="10"><title>{count} {css}</title></rect>'
        )
        x += width
    return (
        '<svg class="bar" viewBox="0 0 100 10" preserveAspectRatio="none" role="img" aria-label="slots">'
        f"{''.join(parts)}</svg>"
    )


def timeline(bars: Sequence[Bar], now: float) -> str:
    """Reservations ahead: each window [start - tolerance, end + tolerance] with its start marked."""
    if not bars:
        return '<p class="empty">No reservations ahead.</p>'
    row = 22
    height = TOP + BOTTOM + row * len(bars)
    end = max(b.high for b in bars)
    frame = _Frame(min(now, *(b.low for b in bars)), end + (end - now) * 0.05 + 1, 0, 1, height)
    parts = _axes_time_only(frame)
    for i, bar in enumerate(bars):
        y = TOP + i * row
        x0, x1 = frame.x(bar.low), frame.x(bar.high)
        parts.append(
            f'<g class="reservation"><rect x="{x0}" y="{y + 3}" width="{max(x1 - x0, 2)}" height="{row - 6}"/>'
            f'<line class="start" x1="{frame.x(bar.start)}" y1="{y}" x2="{frame.x(bar.start)}" y2="{y + row}"/>'
            f'<text class="tick" x="{min(x1 + 4, WIDTH - 120)}" y="{y + 15}">{escape(bar.label)}</text></g>'
        )
    parts.append(f'<line class="now" x1="{frame.x(now)}" y1="{TOP}" x2="{frame.x(now)}" y2="{height - BOTTOM}"/>')
    return _svg("reservations ahead", parts, height)


def _axes_time_only(frame: _Frame) -> list[str]:
    span = frame.x1 - frame.x0
    return [
        f'<text class="tick" x="{frame.x(frame.x0 + span * i / 4)}" y="{frame.height - 8}" '
        f'text-anchor="{"start" if i == 0 else "end" if i == 4 else "middle"}">'
        f"{_clock(frame.x0 + span * i / 4, span)}</text>"
        for i in range(5)
    ]
