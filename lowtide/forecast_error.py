"""Forecast error models: how far a forecast made from a known future is off, and how far off it
is expected to be at each horizon.

A model turns the true values ahead (one every `step`, the first being the current value, which
is known exactly) into what a forecaster would have published, with a random generator the
caller seeds, so the same seed gives the same forecast. It also states its expected relative
error (one standard deviation) at a horizon, which a planner can weigh a forecast point by.

- `IidError`: every point is off by (1 + relative x N(0, 1)), independently: the simplest model,
  and a flattering one, since real errors are correlated in time.
- `HorizonError`: the error grows with the horizon (3 % at 1 hour to 15 % at 24 hours by
  default, about what published day-ahead carbon-intensity forecasts show), is correlated from
  one point to the next (AR(1), rho per step), and the forecast also gets the timing of ramps
  wrong: it is read from the truth at a time offset that grows with the horizon.

Nothing here does I/O; the signal service's replay feed and the carbon bench both use it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

_HOUR = timedelta(hours=1)
_DAY = timedelta(hours=24)


class ErrorModel(Protocol):
    def stddev(self, horizon: timedelta) -> float:
        """The expected relative error (one standard deviation) of a point `horizon` ahead."""
        ...

    def perturb(self, truth: Sequence[float], step: timedelta, rng: random.Random) -> list[float]:
        """The forecast of `truth` (truth[i] is `i x step` ahead; truth[0] is now, known exactly
        and returned as it is). Values stay at 0 or more."""
        ...


@dataclass(frozen=True, slots=True)
class IidError:
    relative: float

    def stddev(self, horizon: timedelta) -> float:
        return self.relative if horizon > timedelta(0) else 0.0

    def perturb(self, truth: Sequence[float], step: timedelta, rng: random.Random) -> list[float]:
        if not truth:
            return []
        if not self.relative:
            return list(truth)
        gauss, r = rng.gauss, self.relative
        return [truth[0], *(max(0.0, v * (1 + r * gauss())) for v in truth[1:])]


@dataclass(frozen=True, slots=True)
class HorizonError:
    """Relative error `at_1h` one hour ahead growing linearly to `at_24h` at 24 hours (and on at
    the same rate beyond; proportionally to the horizon under an hour), AR(1)-correlated with
    `rho` per step of 30 minutes, and a time shift of N(0, shift_at_24h) scaled by horizon / 24 h,
    drawn once per forecast (a ramp forecast early or late by more the further ahead it is)."""

    at_1h: float = 0.03
    at_24h: float = 0.15
    rho: float = 0.9
    shift_at_24h: timedelta = timedelta(hours=1)

    def __post_init__(self) -> None:
        if not (0 <= self.at_1h <= self.at_24h):
            raise ValueError("the error at 1 h must be between 0 and the error at 24 h")
        if not (0 <= self.rho < 1):
            raise ValueError("rho must be in [0, 1)")
        if self.shift_at_24h < timedelta(0):
            raise ValueError("the time shift cannot be negative")

    def stddev(self, horizon: timedelta) -> float:
        hours = horizon / _HOUR
        if hours <= 0:
            return 0.0
        if hours < 1:
            return self.at_1h * hours
        return self.at_1h + (self.at_24h - self.at_1h) * (hours - 1) / 23

    def perturb(self, truth: Sequence[float], step: timedelta, rng: random.Random) -> list[float]:
        if not truth:
            return []
        # rho is given per half hour; per step it is rho ** (step / 30 min).
        rho = self.rho ** (step / timedelta(minutes=30))
        fresh = math.sqrt(1 - rho * rho)
        shift = rng.gauss() * (self.shift_at_24h / step)  # in steps, at 24 h
        per_day = _DAY / step
        out = [truth[0]]
        z = rng.gauss()
        last = len(truth) - 1
        for i in range(1, len(truth)):
            if i > 1:
                z = rho * z + fresh * rng.gauss()
            # Read the truth a shifted time away (interpolated, held at the ends).
            at = min(max(i + shift * i / per_day, 0.0), float(last))
            lo = int(at)
            hi = min(lo + 1, last)
            value = truth[lo] + (truth[hi] - truth[lo]) * (at - lo)
            out.append(max(0.0, value * (1 + self.stddev(i * step) * z)))
        return out


def model_named(name: str, *, relative: float = 0.05, at_1h: float = 0.03, at_24h: float = 0.15) -> ErrorModel:
    """`iid` (with `relative`) or `horizon` (with `at_1h` and `at_24h`)."""
    if name == "iid":
        return IidError(relative)
    if name == "horizon":
        return HorizonError(at_1h, at_24h)
    raise ValueError(f"unknown forecast error model {name!r} (iid or horizon)")
