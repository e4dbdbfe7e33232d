"""What the console says about a signal's forecast, beside its chart: when it was issued, how sure it
is (each point states an expected error: the band is ± that around the value), where that error
comes from (the feed, the calibration learned from the feed's record, or the prior), and how the
values that came since it was issued compare with it. Pure functions of the numbers."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Point:
    at: float
    value: float
    # One standard deviation, relative (0.05 is 5 %); None when the point states none.
    error: float | None
    source: str
    # actual / forecast - 1 as the calibration learned it at this point's lead; None when unstated.
    bias: float | None = None


def _where_from(source: str) -> str:
    if source == "feed":
        return "stated by the feed"
    if source == "prior":
        return "the configured prior (too little record of this feed yet at that lead)"
    if source.startswith("learned"):
        return f"{source} of this feed's forecasts against the values that came"
    return "not stated"


def _at(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC")


def _sure(points: Sequence[Point], now: float) -> str:
    """The error stated for the next value (the first point after now) and at the forecast's end."""
    following = [p for p in points if p.at > now and p.error is not None]
    if not following:
        return "How sure: it states no error ahead." if any(p.at > now for p in points) else ""
    first, last = following[0], following[-1]
    end = f", ±{last.error:.0%} at its end" if last is not first else ""
    return f"How sure: ±{first.error:.0%} for the next value{end}."


def _bias(points: Sequence[Point], now: float) -> str:
    """The learned bias at the next value's lead, when the record has taught one."""
    following = [p for p in points if p.at > now]
    bias = following[0].bias if following else None
    if bias is None or abs(bias) < 0.005:
        return ""
    way = "under" if bias < 0 else "over"
    return (
        f"Its record says the values come {abs(bias):.0%} {way} such a forecast at the next value's lead "
        "(its bias, which the planner takes out)."
    )


def _sources(points: Sequence[Point]) -> str:
    counts = Counter(p.source for p in points if p.error is not None)
    if not counts:
        return ""
    if len(counts) == 1:
        return f"The error is {_where_from(next(iter(counts)))}."
    listed = "; ".join(f"{_where_from(source)} for {n} point(s)" for source, n in counts.most_common())
    return f"The error is {listed}."


def _since_issued(points: Sequence[Point], history: Sequence[tuple[float, float]], now: float) -> str:
    """The values that came since the forecast's first point, against the point covering each."""
    times = [p.at for p in points]
    pairs = []
    for t, value in history:
        if t < times[0] or t > now:
            continue
        point = points[bisect.bisect_right(times, t) - 1]
        if point.value:
            pairs.append((point, value))
    if not pairs:
        return ""
    off = sum(value / p.value - 1 for p, value in pairs) / len(pairs)
    inside = sum(1 for p, value in pairs if p.error is not None and abs(value - p.value) <= abs(p.value) * p.error)
    way = "above" if off > 0 else "below"
    return (
        f"Since it was issued, {len(pairs)} value(s) came: on average {abs(off):.0%} {way} it, "
        f"{inside} of {len(pairs)} inside its band."
    )


def note(
    points: Sequence[Point], *, issued_at: float | None, source: str, history: Sequence[tuple[float, float]], now: float
) -> list[str]:
    """The sentences under a signal's chart about its forecast."""
    if not points:
        return ["No forecast: the signal's feed gives none (yet)."]
    issued = f" issued at {_at(issued_at)}" if issued_at else ""
    lines = [
        f"Forecast{issued} by {source or 'the feed'}: drawn dashed as it was issued, beside the values that "
        "came (solid), in a band of ± its expected error around each value (one standard deviation: "
        "about two values in three should land inside)."
    ]
    said = (_sure(points, now), _sources(points), _bias(points, now), _since_issued(points, history, now))
    lines += [line for line in said if line]
    return lines
