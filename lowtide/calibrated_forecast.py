"""The forecast a plan weighs, made from a feed's bare forecast and what the signal's calibration
learned from the feed's record (lowtide.forecast_calibration): the current value first, known,
then each later point corrected as `Calibration.correct` says (the present plus the learned share
of the change the forecast predicts from it, with the error left around that; or, before that is
learned, the bias taken out and moved by the part of the present error that persists), or as
issued, stating no error, when the record says the bare forecast plans best (`raw`).

The scheduler's release planning and the carbon bench's `replanned_learned` mode both make their
forecast here, so what the bench measures is what production plans on. Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from datetime import datetime

from lowtide.forecast_calibration import BUCKET_EDGES_H, PRIOR_FORECASTS, Calibration


def planning_points(
    calibration: Calibration,
    issued_at: datetime,
    points: Iterable[tuple[datetime, float]],
    *,
    now: datetime,
    actual: float | None,
    scale: float = 1.0,
) -> list[tuple[datetime, float, float]]:
    """(time, value, relative error) for a plan at `now`: (now, actual, 0) when the current
    value is known, then the forecast's points after `now`, corrected. `scale` is the feed's
    time per wall-clock time (a replay's speed): the calibration counts leads in the feed's time."""
    if scale <= 0:
        raise ValueError(f"a lead scale must be positive ({scale})")
    listed = sorted(points)

    def feed_time(at: datetime) -> datetime:
        return at if scale == 1.0 else issued_at + (at - issued_at) * scale

    # The corrected points come back in time order, the order of `listed` (scaling keeps it).
    corrected = calibration.correct(
        issued_at, [(feed_time(at), value) for at, value in listed], now=feed_time(now), actual=actual
    )
    if calibration.raw:
        # The record says the bare forecast plans best: its values, stating no error.
        corrected = [(at, value, 0.0) for at, value in listed]
    ahead = [(at, value, error) for (at, _), (_, value, error) in zip(listed, corrected, strict=True) if at > now]
    return ahead if actual is None else [(now, actual, 0.0), *ahead]


def shared_error(calibration: Calibration) -> float:
    """How much of a point's error the point half an hour later shares (the persistence the
    calibration learned, blended toward all of it while the record behind it is short: without a
    record the errors are not known to be independent). The planner weighs the error less in a
    full pool only as far as they are (scheduler_service.domain.pool_share)."""
    if not calibration.persistence:
        return 1.0
    b = bisect.bisect_right(BUCKET_EDGES_H, 0.5) - 1
    weight = calibration.buckets[b].forecasts / (calibration.buckets[b].forecasts + PRIOR_FORECASTS)
    return min(1.0, max(0.0, calibration.persistence[b] + 1 - weight))
