"""How much of its caution a task keeps when it shares a full pool with other tasks
(scheduler_service.domain.planning plans with it). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from statistics import NormalDist
from typing import Protocol


class Task(Protocol):
    """A task of the plan (planning.PlanTask)."""

    @property
    def earliest(self) -> datetime: ...
    @property
    def latest_start(self) -> datetime: ...
    @property
    def duration(self) -> timedelta: ...


class Points(Protocol):
    """The plan's forecast (planning.Forecast)."""

    @property
    def error_shared(self) -> float | None: ...

    def breakpoints(self, start: datetime, end: datetime) -> list[datetime]: ...


def contended_share(tasks: Sequence[Task], slots: int, now: datetime, forecast: Points) -> float:
    """The share of its caution a task keeps in a pool that cannot run every task in its
    cheapest window. The caution is what a start later than now must beat its forecast by: the
    lowest of a window's noisy forecast values is lower than what comes (the winner's curse), and
    a lone task takes the lowest. Tasks that share a pool share its starts: of the n forecast
    values from now to the last latest start, the tasks with a choice take about as many as their
    runs fill with `slots` running at once, m, and the mean of the lowest m of n values whose
    errors are independent is less far under what comes than the lowest alone. Errors the next
    point shares a part rho of (the forecast's `error_shared`) choose among fewer independent values: n and m
    are counted as 1 + (n - 1)(1 - rho) / (1 + rho) and m in the same proportion (the effective
    count of an AR(1) series). So the caution is scaled by (the mean of the m lowest of n standard
    normal order statistics) / (the lowest): 1 when the tasks' runs fill one value's time (a task
    with the pool to itself) or the errors are not known to be independent (None), 0 when the
    runs fill every value (no choosing left to err by). Blom's approximation of the order
    statistics, m's last one in part when m is not whole; pure."""
    if forecast.error_shared is None or slots <= 0:
        return 1.0
    choosing = [t for t in tasks if t.latest_start > max(t.earliest, now)]
    if not choosing:
        return 1.0
    last = max(t.latest_start for t in choosing)
    values = 1 + len([at for at in forecast.breakpoints(now, last) if at > now])
    if values <= 1:
        return 1.0
    step = (last - now) / (values - 1)
    taken = min(values, math.ceil(sum((t.duration for t in choosing), timedelta(0)) / step / slots))
    rho = min(1.0, max(0.0, forecast.error_shared))
    n = 1 + (values - 1) * (1 - rho) / (1 + rho)
    m = taken * n / values
    if n <= 1 or m <= 1:
        return 1.0
    whole = int(m)
    lowest = [_NORMAL.inv_cdf((min(r, n) - 0.375) / (n + 0.25)) for r in range(1, whole + 2)]
    mean = (math.fsum(lowest[:whole]) + (m - whole) * lowest[whole]) / m
    return max(0.0, min(1.0, mean / lowest[0]))


_NORMAL = NormalDist()
