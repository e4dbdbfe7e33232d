"""Carbon saved by planned release, on the 2020 Great Britain trace.

A 30-minute job arrives every 30 minutes through 2020 (17,568 jobs) and may wait `slack` (4 h,
8 h, 24 h) before it starts. Each policy picks a start in [arrival, arrival + slack]; the carbon
of a job is the trace's true mean intensity over its run (every job draws the same power, so
the saving is the relative drop of the summed intensities against starting at arrival):

- `oracle`: the best start with the true future known;
- `planner`: `scheduler_service.domain.planning.plan` on a 48-hour forecast issued at arrival
  (as the UK Carbon Intensity API publishes), with 0 % and 5 % error: the trace's future values
  times (1 + error x N(0, 1)), seeded, drawn afresh for every forecast, while the current value is
  known exactly;
- `threshold`: the plain cost hold: start at the first moment the signal is under last week's
  10th, 30th or 50th percentile, at the latest at the end of the slack.

`burst` checks capacity: every day at 18:00 sixteen jobs arrive at once for a pool of four slots,
with 24 hours of slack and a forecast with 5 % error. Planned with the pool's capacity (and the
previous day's runs still ahead as commitments), they spread over the next-best windows; planned
as if the pool were unbounded, they pile onto the same window and, run four at a time, queue past
it. Both are measured against running them four at a time from arrival.

`ratio_to_oracle` is planner saving / oracle saving. The trace is from Wiesner et al., "Let's Wait
Awhile: How Temporal Workload Shifting Can Reduce Carbon Emissions in the Cloud" (Middleware 2021).
"""

from __future__ import annotations

import bisect
import heapq
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler_service.domain.planning import Capacity, Commitment, Forecast, PlanTask, plan
from signal_service.feeds.replay import load_trace

YEAR_START = datetime(2020, 1, 1, tzinfo=UTC)
YEAR_END = datetime(2021, 1, 1, tzinfo=UTC)
ARRIVAL_EVERY = timedelta(minutes=30)
DURATION = timedelta(minutes=30)
SLACKS_H = (4, 8, 24)
ERRORS = (0.0, 0.05)
HORIZON = timedelta(hours=48)
WEEK = timedelta(days=7)
PERCENTILES = (10, 30, 50)
SEED = 2020
# One job is planned at a time, so even a pool of one never runs out of room: the evaluation
# measures the choice of window, not queueing.
POOL = Capacity(max_running=1)
BURST_HOUR = 18
BURST_JOBS = 16
BURST_SLOTS = 4
BURST_SLACK = timedelta(hours=24)
BURST_ERROR = 0.05


def _percentile(ordered: list[float], p: int) -> float:
    """Nearest rank: the value at or under which p % of `ordered` lies."""
    return ordered[max(0, -(-p * len(ordered) // 100) - 1)]


def carbon_evaluation() -> dict[str, Any]:
    began = time.perf_counter()
    trace = load_trace()
    times = [p.at for p in trace]
    values = [p.value for p in trace]
    truth = Forecast.of((p.at, p.value) for p in trace)
    rng = random.Random(SEED)
    # The true carbon of a job starting on each trace row, looked up rather than recomputed.
    on_row = [truth.mean(at, DURATION) for at in times]

    arrivals = []
    at = YEAR_START
    while at < YEAR_END:
        arrivals.append(at)
        at += ARRIVAL_EVERY

    baseline = 0.0
    oracle = dict.fromkeys(SLACKS_H, 0.0)
    planner = {(s, e): 0.0 for s in SLACKS_H for e in ERRORS}
    threshold = {(s, p): 0.0 for s in SLACKS_H for p in PERCENTILES}
    late = 0
    for arrival in arrivals:
        now_index = bisect.bisect_right(times, arrival) - 1
        baseline += on_row[now_index]
        week = sorted(values[bisect.bisect_left(times, arrival - WEEK) : now_index])
        limits = {p: _percentile(week, p) for p in PERCENTILES}
        forecasts = {error: _forecast(times, values, arrival, error, rng) for error in ERRORS}
        for slack_h in SLACKS_H:
            latest = arrival + timedelta(hours=slack_h)
            task = PlanTask(0, arrival, latest, DURATION)
            # Every start on a trace row is a candidate: arrivals are on rows, the latest start is
            # one, and a half-hour job starting on a row ends on one, so no better start lies between.
            oracle[slack_h] += min(on_row[now_index : bisect.bisect_right(times, latest)])
            for error, forecast in forecasts.items():
                (chosen,) = plan([task], forecast, POOL, arrival, signal_low=False, resolution=ARRIVAL_EVERY)
                late += chosen.release_at > latest
                planner[slack_h, error] += truth.mean(chosen.release_at, DURATION)
            for p, limit in limits.items():
                release = _first_under(times, values, arrival, latest, limit)
                threshold[slack_h, p] += truth.mean(release, DURATION)

    def saving(total: float) -> float:
        return 1 - total / baseline

    def versus(total: float, best: float) -> dict[str, Any]:
        got = saving(total)
        return {"saving_pct": round(100 * got, 2), "ratio_to_oracle": round(got / best, 3) if best > 0 else None}

    results: dict[str, Any] = {
        "jobs": len(arrivals),
        "job_duration_min": DURATION // timedelta(minutes=1),
        "forecast_horizon_h": HORIZON // timedelta(hours=1),
        "baseline_mean_gco2_per_kwh": round(baseline / len(arrivals), 2),
        "planned_after_latest_start": late,
    }
    for slack_h in SLACKS_H:
        best = saving(oracle[slack_h])
        entry: dict[str, Any] = {"oracle_saving_pct": round(100 * best, 2)}
        for error in ERRORS:
            entry[f"planner_error_{round(error * 100)}pct"] = versus(planner[slack_h, error], best)
        for p in PERCENTILES:
            entry[f"threshold_p{p}"] = versus(threshold[slack_h, p], best)
        results[f"slack_{slack_h}h"] = entry
    results["burst"] = _bursts(times, values, truth, rng)
    results["elapsed_s"] = round(time.perf_counter() - began, 2)
    return results


def _forecast(times: list[datetime], values: list[float], now: datetime, error: float, rng: random.Random) -> Forecast:
    """What a grid API would publish at `now`: the current value, then the trace's next 48 hours
    with multiplicative error."""
    here = bisect.bisect_right(times, now) - 1
    ahead = bisect.bisect_left(times, now + HORIZON)
    future = zip(times[here + 1 : ahead], values[here + 1 : ahead], strict=True)
    noisy = [(t, v * (1 + error * rng.gauss()) if error else v) for t, v in future]
    return Forecast.of([(now, values[here]), *noisy], end=now + HORIZON)


def _bursts(times: list[datetime], values: list[float], truth: Forecast, rng: random.Random) -> dict[str, Any]:
    at_once = aware = unaware = 0.0
    aware_late = unaware_late = peak = 0
    # The pool as each policy left it: when each slot frees up (FIFO runs), or the planned runs.
    fifo_at_once = [YEAR_START] * BURST_SLOTS
    fifo_unaware = [YEAR_START] * BURST_SLOTS
    planned: list[tuple[datetime, datetime]] = []
    day = YEAR_START + timedelta(hours=BURST_HOUR)
    while day < YEAR_END:
        latest = day + BURST_SLACK
        tasks = [PlanTask(i, day, latest, DURATION) for i in range(BURST_JOBS)]
        forecast = _forecast(times, values, day, BURST_ERROR, rng)
        ahead = tuple(Commitment(start, end) for start, end in planned if end > day)
        plans = plan(tasks, forecast, Capacity(BURST_SLOTS, ahead), day, signal_low=False, resolution=ARRIVAL_EVERY)
        runs = [(p.release_at, p.release_at + DURATION) for p in plans]
        planned = [run for run in planned if run[1] > day] + runs
        peak = max(peak, *(sum(s <= start < e for s, e in planned) for start, _ in runs))
        aware_late += sum(p.release_at > latest for p in plans)
        aware += sum(truth.mean(start, DURATION) for start, _ in runs)
        for start in _fifo(fifo_at_once, [day] * BURST_JOBS):
            at_once += truth.mean(start, DURATION)
        piled = plan(tasks, forecast, Capacity(BURST_JOBS), day, signal_low=False, resolution=ARRIVAL_EVERY)
        for start in _fifo(fifo_unaware, sorted(p.release_at for p in piled)):
            unaware += truth.mean(start, DURATION)
            unaware_late += start > latest
        day += timedelta(days=1)
    return {
        "jobs": BURST_JOBS,
        "slots": BURST_SLOTS,
        "capacity_aware": {
            "saving_pct": round(100 * (1 - aware / at_once), 2),
            "started_after_latest_start": aware_late,
            "peak_running": peak,
        },
        "capacity_unaware": {
            "saving_pct": round(100 * (1 - unaware / at_once), 2),
            "started_after_latest_start": unaware_late,
        },
    }


def _fifo(free_at: list[datetime], releases: list[datetime]) -> list[datetime]:
    """Starts of jobs released at `releases` (in order) on a pool whose slots free up at
    `free_at` (a heap, updated): each takes the first slot free at or after its release."""
    starts = []
    for release in releases:
        start = max(release, heapq.heappop(free_at))
        heapq.heappush(free_at, start + DURATION)
        starts.append(start)
    return starts


def _first_under(
    times: list[datetime], values: list[float], arrival: datetime, latest: datetime, limit: float
) -> datetime:
    """The threshold hold: the first moment in [arrival, latest] the signal is under `limit`,
    else `latest` (the hold is bounded by the latest start)."""
    i = bisect.bisect_right(times, arrival) - 1
    if values[i] < limit:
        return arrival
    i += 1
    while i < len(times) and times[i] <= latest:
        if values[i] < limit:
            return times[i]
        i += 1
    return latest
