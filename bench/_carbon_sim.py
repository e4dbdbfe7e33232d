"""The carbon evaluation's simulations, on 30-minute rows: a 30-minute job arrives on every row
and may wait `slack` rows; a policy picks each job's start row; a pool of `slots` runs at most
that many jobs in a row (None: unbounded).

- `replanned`: as the scheduler does it: on each row a new forecast is issued and every pending
  job is planned again, all together, with the pool's capacity; the jobs planned for now start
  (at most `slots` of them, tightest latest start first), the rest wait for the next row.
- `planned_once`: as the old bench did: each job is planned at its arrival, on that forecast,
  with the runs already planned as commitments, and then run when planned (queueing for a slot
  when the plan found none).

Both plan beside the work to expect as the scheduler estimates it (the arrivals of the last day,
each expected again a day later: `scheduler_service.domain.demand`), with the same `plan()`.
- `oracle_unbounded`: the cheapest row in each job's window, the true future known.
- `oracle_pool`: the cheapest assignment of jobs to rows with at most `slots` jobs a row, exact
  (an LP over the job-row pairs, integral since it is a transportation problem, solved by HiGHS).
- `threshold`: the cost hold: the first row under last week's percentile, at the latest at the
  end of the slack.

Each returns the start row of every job (the same order as the arrivals).
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from lowtide.calibrated_forecast import planning_points, shared_error
from lowtide.forecast_calibration import Calibration, Issued, Record
from lowtide.forecast_error import ErrorModel
from scheduler_service.domain.demand import LOOKBACK, Submitted, expected_arrivals
from scheduler_service.domain.planning import CAUTION, Capacity, Commitment, Forecast, PlanTask, plan

ROW = timedelta(minutes=30)
HORIZON_ROWS = 96  # 48 hours, as the UK Carbon Intensity API publishes
UNBOUNDED = 10**6


@dataclass(frozen=True)
class Rows:
    times: list[datetime]
    values: list[float]


class Forecasts:
    """The forecast issued on each row under one error model, drawn once (seeded by row) and
    shared by every policy, slack and pool, so they are compared on the same forecasts. Each
    point states the model's expected error (`stated`), or none (`blind`: what real feeds give)."""

    def __init__(self, rows: Rows, model: ErrorModel, seed: str, *, stated: bool = True) -> None:
        self._rows, self._model, self._seed = rows, model, seed
        self._cache: dict[int, Forecast] = {}
        self._drawn: dict[int, list[float]] = {}
        self._errors = [model.stddev(i * ROW) if stated else 0.0 for i in range(HORIZON_ROWS + 1)]

    def blind(self) -> Forecasts:
        """The same forecasts, stating no error."""
        other = Forecasts(self._rows, self._model, self._seed, stated=False)
        other._drawn = self._drawn
        return other

    def drawn(self, k: int) -> list[float]:
        """The values issued on row k (the first is row k's, known)."""
        got = self._drawn.get(k)
        if got is None:
            last = min(len(self._rows.values) - 1, k + HORIZON_ROWS)
            truth = self._rows.values[k : last + 1]
            got = self._drawn[k] = self._model.perturb(truth, ROW, random.Random(f"{self._seed}:{k}"))
        return got

    def at(self, k: int) -> Forecast:
        cached = self._cache.get(k)
        if cached is not None:
            return cached
        times = self._rows.times
        noisy = self.drawn(k)
        points = [(times[k + i], noisy[i], self._errors[i]) for i in range(len(noisy))]
        forecast = Forecast.of(points, end=times[k + len(noisy) - 1] + ROW)
        self._cache[k] = forecast
        return forecast

    def caution(self, k: int) -> float:
        return CAUTION

    def newest(self, k: int) -> Issued:
        times, drawn = self._rows.times, self.drawn(k)
        return Issued(times[k], tuple((times[k + i], drawn[i]) for i in range(1, len(drawn))))

    def issued_on(self, k: int) -> Sequence[Issued]:
        return [self.newest(k)]


class Learned:
    """The forecasts of `source` issued bare, each point given the bias and error the project's
    calibration (lowtide.forecast_calibration) learned from the forecasts issued before it and
    the values that came, and planned with the caution it found to pay: production's path, with
    no look at the model. The record starts `history` rows before the first plan (a deployment
    has its past), and is learned again every `every` rows."""

    def __init__(self, rows: Rows, source: Issuing, start: int, *, history: int, every: int = 48) -> None:
        self._rows, self._source, self._start, self._every = rows, source, start, every
        self._record = Record()
        self._fed = max(0, start - history)
        self._learned: dict[int, Calibration] = {}
        self._cache: dict[int, Forecast] = {}

    def _calibrated(self, k: int) -> Calibration:
        """The calibration learned at the last learning row at or before k (from what was known
        there: `Record.learn` reads nothing after its `now`)."""
        anchor = k - (k - self._start) % self._every
        learned = self._learned.get(anchor)
        if learned is not None:
            return learned
        times, values = self._rows.times, self._rows.values
        while self._fed < anchor:
            # Row `fed` is over: its value came, and its forecasts were issued.
            j = self._fed
            self._record.add_actual(times[j], values[j])
            for issued in self._source.issued_on(j):
                self._record.add_forecast(issued)
            self._fed += 1
        self._record.add_actual(times[anchor], values[anchor])
        learned = self._learned[anchor] = self._record.learn(times[anchor])
        return learned

    def at(self, k: int) -> Forecast:
        cached = self._cache.get(k)
        if cached is not None:
            return cached
        calibration = self._calibrated(k)
        now = self._rows.times[k]
        issued = self._source.newest(k)
        actual = self._rows.values[k]
        # Production's path: the scheduler plans on the same (scheduler_service.holds.cost).
        points = planning_points(calibration, issued.issued_at, issued.points, now=now, actual=actual)
        forecast = Forecast.of(points, end=issued.points[-1][0] + ROW, error_shared=shared_error(calibration))
        self._cache[k] = forecast
        return forecast

    def caution(self, k: int) -> Callable[[timedelta], float]:
        return self._calibrated(k).caution_for


class Issuing(Protocol):
    def newest(self, k: int) -> Issued:
        """The newest forecast issued by row k's time, as issued (no error stated)."""
        ...

    def issued_on(self, k: int) -> Sequence[Issued]:
        """The forecasts issued during row k."""
        ...


class ForecastSource(Protocol):
    def at(self, k: int) -> Forecast: ...

    def caution(self, k: int) -> float | Callable[[timedelta], float]: ...


def replanned(
    rows: Rows,
    arrivals: range,
    slack: int,
    slots: int | None,
    forecasts: ForecastSource,
    *,
    sticky: bool = True,
) -> list[int]:
    times = rows.times
    pool = slots or UNBOUNDED
    lookback = LOOKBACK // ROW
    started: dict[int, int] = {}
    pending: list[int] = []
    # Each pending job's last planned start, handed to the next plan (as the scheduler does).
    previous: dict[int, datetime] = {}
    k = arrivals.start
    while k < arrivals.stop or pending:
        if k < arrivals.stop:
            pending.append(k)
        tasks = [PlanTask(a, times[a], times[a + slack], ROW, previous.get(a) if sticky else None) for a in pending]
        # The work expected next, from the arrivals of the last day, as the scheduler estimates it.
        recent = (Submitted(times[a], slack * ROW, ROW) for a in range(max(arrivals.start, k - lookback + 1), k + 1))
        expected = expected_arrivals(recent, times[k]) if slots else []
        plans = plan(
            tasks,
            forecasts.at(k),
            Capacity(pool),
            times[k],
            signal_low=False,
            resolution=ROW,
            caution=forecasts.caution(k),
            expected=expected,
        )
        previous = {p.task_id: p.release_at for p in plans}
        due = sorted(p.task_id for p in plans if p.release_at <= times[k])
        # At most `slots` start; the tightest latest start (the earliest arrival) first.
        for a in due[:pool]:
            started[a] = k
        if due:
            chosen = set(due[:pool])
            pending = [a for a in pending if a not in chosen]
        k += 1
    return [started[a] for a in arrivals]


def planned_once(rows: Rows, arrivals: range, slack: int, slots: int | None, forecasts: ForecastSource) -> list[int]:
    times = rows.times
    pool = slots or UNBOUNDED
    lookback = LOOKBACK // ROW
    planned: dict[int, int] = {}
    ahead: list[int] = []  # planned start rows of the jobs planned so far, still to come
    for a in arrivals:
        ahead = [s for s in ahead if s >= a]
        committed = tuple(Commitment(times[s], times[s] + ROW) for s in ahead) if slots else ()
        task = PlanTask(a, times[a], times[a + slack], ROW)
        recent = (Submitted(times[r], slack * ROW, ROW) for r in range(max(arrivals.start, a - lookback + 1), a + 1))
        (p,) = plan(
            [task],
            forecasts.at(a),
            Capacity(pool, committed),
            times[a],
            signal_low=False,
            resolution=ROW,
            caution=forecasts.caution(a),
            expected=expected_arrivals(recent, times[a]) if slots else [],
        )
        start = bisect.bisect_left(times, p.release_at)
        planned[a] = start
        ahead.append(start)
    if slots is None:
        return [planned[a] for a in arrivals]
    # Run as planned, `slots` a row; a job whose row is full queues (earliest planned first).
    queue: list[tuple[int, int]] = []
    order = sorted(arrivals, key=lambda a: (planned[a], a))
    started: dict[int, int] = {}
    i, k = 0, min(planned.values())
    while i < len(order) or queue:
        while i < len(order) and planned[order[i]] <= k:
            heapq.heappush(queue, (planned[order[i]], order[i]))
            i += 1
        for _ in range(min(slots, len(queue))):
            started[heapq.heappop(queue)[1]] = k
        k += 1
    return [started[a] for a in arrivals]


def oracle_unbounded(rows: Rows, arrivals: range, slack: int) -> list[int]:
    values = rows.values
    return [min(range(a, a + slack + 1), key=lambda k: (values[k], k)) for a in arrivals]


def oracle_pool(rows: Rows, arrivals: range, slack: int, slots: int) -> list[int]:
    """min sum of values[start] over jobs, each job one row in [a, a + slack], at most `slots` a
    row: variables x[job, row] in [0, 1]; the constraint matrix is an interval (network) matrix,
    so HiGHS's optimal vertex is integral."""
    jobs = len(arrivals)
    first = arrivals.start
    cols = slack + 1
    job: Any = np.repeat(np.arange(jobs), cols)
    row = job + np.tile(np.arange(cols), jobs)  # relative to the first arrival
    cost = np.asarray(rows.values, dtype=float)[first + row]
    var = np.arange(jobs * cols)
    a_eq = coo_matrix((np.ones(jobs * cols), (job, var)), shape=(jobs, jobs * cols)).tocsr()
    span = jobs + slack
    a_ub = coo_matrix((np.ones(jobs * cols), (row, var)), shape=(span, jobs * cols)).tocsr()
    result = linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.full(span, slots, dtype=float),
        A_eq=a_eq,
        b_eq=np.ones(jobs),
        bounds=(0, 1),
        method="highs",
    )
    if result.status != 0:
        raise RuntimeError(f"the pool oracle's LP failed: {result.message}")
    x = result.x.reshape(jobs, cols)
    picks = x.argmax(axis=1)
    if not np.allclose(x.max(axis=1), 1.0, atol=1e-6):
        raise RuntimeError("the pool oracle's LP has a fractional optimum")
    return [first + i + int(c) for i, c in enumerate(picks)]


def threshold(rows: Rows, arrivals: range, slack: int, percentile: int) -> list[int]:
    values = rows.values
    week = 7 * 48
    starts = []
    for a in arrivals:
        past = sorted(values[max(0, a - week) : a]) or [values[a]]
        limit = past[max(0, -(-percentile * len(past) // 100) - 1)]
        starts.append(next((k for k in range(a, a + slack + 1) if values[k] < limit), a + slack))
    return starts


def costs(rows: Rows, starts: Sequence[int]) -> float:
    return sum(rows.values[k] for k in starts)
