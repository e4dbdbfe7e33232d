"""The signal service's forecast calibration, from its message (lowtide.v1.ForecastCalibration)
back into what the planner corrects a forecast with (lowtide.forecast_calibration)."""

from __future__ import annotations

import math
from datetime import UTC

from lowtide.forecast_calibration import BUCKET_EDGES_H, Bucket, Calibration
from lowtide.forecast_profile import SLOTS
from lowtide_proto.lowtide.v1 import signal_pb2


def calibration_of(message: signal_pb2.ForecastCalibration) -> Calibration | None:
    """The calibration, or None when its lead buckets are not this version's (a signal service
    of another release) or a number in it is not finite (a NaN caution would make every score
    NaN): the forecast is then planned on its points' errors alone."""
    buckets = tuple(
        Bucket(b.from_hours, b.to_hours or math.inf, b.forecasts, b.samples, b.bias, b.error) for b in message.buckets
    )
    if tuple(b.lo_h for b in buckets) != BUCKET_EDGES_H:
        return None
    numbers = [message.caution, message.caution_slope, *message.day_profile]
    for b in message.buckets:
        numbers += [b.bias, b.error, b.persistence, b.follow, b.residual, b.profile_share]
    if not all(math.isfinite(n) for n in numbers):
        return None
    shares = tuple(b.profile_share for b in message.buckets)
    # A profile of another length (another release's), or shares without one: planned without it.
    profiled = len(message.day_profile) == SLOTS and any(shares)
    return Calibration(
        at=message.learned_at.ToDatetime(tzinfo=UTC),
        buckets=buckets,
        caution=message.caution,
        caution_jobs=message.caution_jobs,
        caution_slope=message.caution_slope,
        days=message.days,
        persistence=tuple(b.persistence for b in message.buckets),
        follow=tuple(b.follow for b in message.buckets) if message.follows else (),
        residual=tuple(b.residual for b in message.buckets) if message.follows else (),
        raw=message.raw,
        follow_raw=message.follow_raw,
        profile=tuple(message.day_profile) if profiled else (),
        profile_share=shares if profiled else (),
    )
