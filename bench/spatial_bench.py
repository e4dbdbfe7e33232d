"""Where and when: carbon saved by running each job in the region and the hour with the cleanest
power, over two or more grid traces aligned in time (one per region).

Each region submits a 30-minute job on every row of the carbon evaluation's sample (the same
blocks of days, bench/carbon_bench.py), and every job may run in any region, on a pool of
`slots` slots per region, within `slack` of its arrival. The saving is against running every job
at once where it was submitted. Policies:

- `at_once`: where submitted, at arrival (queueing for a slot there).
- `best_region_now`: at arrival, in the region whose signal is lowest now (what the Carbon Aware
  SDK's "best location" answers), the next lowest when its pool is full; no waiting for an hour.
- `where_and_when`: lowtide's placement (scheduler_service.domain.placement), re-planned on every
  new forecast of every region, each with its expected error and its pool, beside the work
  expected from the last day's arrivals (as the temporal evaluation's plans); a job planned for now
  starts there when its pool has a slot; at its latest start it starts in any region with room.
- `where_and_when_learned`: the same on the bare forecasts, each region's bias, error and caution
  learned by the calibration from its own forecasts issued before and the values that came, as
  the temporal evaluation's `replanned_learned` cells (production's path: a pool is planned with
  its signal's calibration, the caution by the window a task has left where that paid).
- `oracle`: the cheapest assignment of jobs to (region, row) with `slots` a region and row, the
  true future known: an LP (a transportation problem, integral), solved by HiGHS as the
  pool-limited oracle of the temporal evaluation is.

Forecasts are drawn per region with the temporal evaluation's error models and seeds of their own.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from bench._carbon_sim import ROW, Forecasts, ForecastSource, Learned, Rows
from bench.carbon_bench import BLOCK_DAYS, BLOCKS, HISTORY_ROWS, MODELS, SEED, figures, resample, sample
from scheduler_service.domain.demand import LOOKBACK, Submitted, expected_arrivals
from scheduler_service.domain.placement import PlaceTask, Region, place
from scheduler_service.domain.planning import Capacity, PlanTask
from signal_service.feeds.replay import load_trace

# The bundled traces: Great Britain's and Germany's 2020 grids (same source and columns).
BUNDLED = tuple(
    str(resources.files("signal_service.data").joinpath(f"{zone}_2020_carbon_intensity.csv")) for zone in ("gb", "de")
)
SLACKS_H = (8, 24)
SLOTS = 2
SPATIAL_MODELS = ("horizon",)
POLICIES = ("at_once", "best_region_now", "where_and_when", "where_and_when_learned", "oracle")

# A job: (its region of submission, its arrival row).
Job = tuple[int, int]
# A policy's answer: each job's (region, start row), in the order of the jobs.
Runs = list[tuple[int, int]]


def aligned(traces: Sequence[str]) -> tuple[list[str], list[Rows]]:
    """Each trace resampled to half hours, cut to the times all of them have."""
    per = [resample([(p.at, p.value) for p in load_trace(t)]) for t in traces]
    first = max(r.times[0] for r in per)
    last = min(r.times[-1] for r in per)
    cut = []
    for r in per:
        lo, hi = r.times.index(first), r.times.index(last)
        cut.append(Rows(r.times[lo : hi + 1], r.values[lo : hi + 1]))
    names = [t.rsplit("/", 1)[-1].split("_", 1)[0] for t in traces]
    return names, cut


def spatial_evaluation(
    traces: Sequence[str], *, slots: int = SLOTS, blocks: int = BLOCKS, days: int = BLOCK_DAYS
) -> dict[str, Any]:
    if len(traces) < 2:
        raise ValueError("the spatial evaluation needs two traces or more (--trace FILE --trace FILE)")
    began = time.perf_counter()
    names, regions = aligned(traces)
    arrivals = sample(regions[0], blocks, days)
    jobs_of = [[(r, a) for a in block for r in range(len(regions))] for block in arrivals]
    baseline = sum(regions[r].values[a] for jobs in jobs_of for r, a in jobs)
    if baseline <= 0:
        raise ValueError("the traces' mean over the sampled days must be above 0 for a saving in percent")
    results: dict[str, Any] = {
        "traces": list(traces),
        "regions": names,
        "slots_per_region": slots,
        "sample": [f"{regions[0].times[b.start]:%Y-%m-%d} +{len(b) // 48}d" for b in arrivals],
        "jobs": sum(len(j) for j in jobs_of),
    }
    for slack_h in SLACKS_H:
        slack = slack_h * 2
        oracle = [oracle_regions(regions, jobs, slack, slots) for jobs in jobs_of]
        best = _saving(regions, oracle, baseline)
        entry: dict[str, Any] = {}
        for model in SPATIAL_MODELS:
            cells: dict[str, Any] = {}
            for policy in POLICIES:
                if policy == "oracle":
                    runs = oracle
                elif policy == "at_once":
                    runs = [at_once(jobs, slots) for jobs in jobs_of]
                elif policy == "best_region_now":
                    runs = [best_region_now(regions, jobs, slots) for jobs in jobs_of]
                else:
                    learned = None if policy == "where_and_when" else arrivals
                    runs = [
                        where_and_when(regions, jobs, slack, slots, _forecasts(regions, model, b, learned))
                        for b, jobs in enumerate(jobs_of)
                    ]
                cells[policy] = _figures(
                    regions, names, jobs_of=jobs_of, runs=runs, slack=slack, baseline=baseline, best=best
                )
            entry[model] = cells
            print(
                f"[spatial] slack {slack_h} h, {model} done after {time.perf_counter() - began:.0f} s", file=sys.stderr
            )
        results[f"slack_{slack_h}h"] = entry
    results["elapsed_s"] = round(time.perf_counter() - began, 2)
    return results


def _forecasts(
    regions: Sequence[Rows], model: str, block: int, learned: Sequence[range] | None = None
) -> list[ForecastSource]:
    """Each region's forecasts of `block` stating the model's error, or (`learned`: the blocks'
    arrivals) issued bare and calibrated on each region's record before the block."""
    stated = [Forecasts(rows, MODELS[model], f"{SEED}:spatial:{model}:{r}:{block}") for r, rows in enumerate(regions)]
    if learned is None:
        return list(stated)
    start = learned[block].start
    return [Learned(rows, f, start, history=HISTORY_ROWS) for rows, f in zip(regions, stated, strict=True)]


def _saving(regions: Sequence[Rows], runs: Sequence[Runs], baseline: float) -> float:
    return 1 - sum(regions[r].values[k] for block in runs for r, k in block) / baseline


def _figures(
    regions: Sequence[Rows],
    names: Sequence[str],
    *,
    jobs_of: Sequence[Sequence[Job]],
    runs: Sequence[Runs],
    slack: int,
    baseline: float,
    best: float,
) -> dict[str, Any]:
    waits = [
        k - a for jobs, block in zip(jobs_of, runs, strict=True) for (_, a), (_, k) in zip(jobs, block, strict=True)
    ]
    late = sum(w > slack for w in waits)
    got = figures(_saving(regions, runs, baseline), best, late, waits)
    where = Counter(r for block in runs for r, _ in block)
    total = sum(where.values())
    got["share"] = {name: round(where[r] / total, 3) for r, name in enumerate(names)}
    return got


def at_once(jobs: Sequence[Job], slots: int) -> Runs:
    return _queued(jobs, slots, lambda job, room: job[0] if room[job[0]] else None)


def best_region_now(regions: Sequence[Rows], jobs: Sequence[Job], slots: int) -> Runs:
    def choose(job: Job, room: list[int]) -> int | None:
        k = job[1]
        open_ = [r for r in range(len(regions)) if room[r]]
        return min(open_, key=lambda r: (regions[r].values[k], r)) if open_ else None

    return _queued(jobs, slots, choose)


def _queued(jobs: Sequence[Job], slots: int, choose: Callable[[Job, list[int]], int | None]) -> Runs:
    """Every job as early as it can, oldest first; `choose` says in which region (None: wait).
    The row `choose` sees is the job's arrival's; a waiting job chooses on the row it starts in."""
    regions = 1 + max(r for r, _ in jobs)
    started: dict[int, tuple[int, int]] = {}
    queue: list[int] = []
    i, k = 0, jobs[0][1]
    while i < len(jobs) or queue:
        while i < len(jobs) and jobs[i][1] <= k:
            queue.append(i)
            i += 1
        room = [slots] * regions
        for j in list(queue):
            region = choose((jobs[j][0], k), room)
            if region is not None:
                room[region] -= 1
                started[j] = (region, k)
                queue.remove(j)
        k += 1
    return [started[j] for j in range(len(jobs))]


def where_and_when(
    regions: Sequence[Rows], jobs: Sequence[Job], slack: int, slots: int, forecasts: Sequence[ForecastSource]
) -> Runs:
    times = regions[0].times
    names = [str(r) for r in range(len(regions))]
    started: dict[int, tuple[int, int]] = {}
    pending: list[int] = []
    previous: dict[int, tuple[str, datetime]] = {}
    i, k = 0, jobs[0][1]
    while i < len(jobs) or pending:
        while i < len(jobs) and jobs[i][1] <= k:
            pending.append(i)
            i += 1
        places = [
            Region(names[r], forecasts[r].at(k), Capacity(slots), caution=forecasts[r].caution(k))
            for r in range(len(regions))
        ]
        tasks = []
        for j in pending:
            a = jobs[j][1]
            last = previous.get(j)
            task = PlanTask(j, times[a], times[a + slack], ROW, last[1] if last else None)
            tasks.append(PlaceTask(task, region=last[0] if last else None))
        # The work expected next, from the arrivals of the last day (a job a region a row), as
        # the scheduler estimates it from the tasks that named pools.
        recent = (
            Submitted(times[a], slack * ROW, ROW, count=len(regions))
            for a in range(max(jobs[0][1], k - LOOKBACK // ROW + 1), min(k + 1, jobs[-1][1] + 1))
        )
        coming = [PlaceTask(t) for t in expected_arrivals(recent, times[k])]
        placed = place(tasks, places, times[k], resolution=ROW, expected=coming)
        previous = {p.task_id: (p.region, p.plan.release_at) for p in placed}
        room = [slots] * len(regions)
        # The tightest latest start first (the earliest arrival, then the order submitted).
        due = sorted(
            (p for p in placed if p.plan.release_at <= times[k]), key=lambda p: (jobs[p.task_id][1], p.task_id)
        )
        for p in due:
            r = int(p.region)
            if room[r]:
                room[r] -= 1
                started[p.task_id] = (r, k)
        # At its latest start a job runs in any region with room (the cleanest now first).
        for j in pending:
            if j not in started and jobs[j][1] + slack <= k:
                open_ = [r for r in range(len(regions)) if room[r]]
                if open_:
                    r = min(open_, key=lambda r: (regions[r].values[k], r))
                    room[r] -= 1
                    started[j] = (r, k)
        pending = [j for j in pending if j not in started]
        k += 1
    return [started[j] for j in range(len(jobs))]


def oracle_regions(regions: Sequence[Rows], jobs: Sequence[Job], slack: int, slots: int) -> Runs:
    """min sum of values[region][start] over jobs, each job one (region, row) with row in
    [arrival, arrival + slack], at most `slots` jobs a region and row: x[job, region, row] in
    [0, 1]; jobs against (region, row) capacities is a transportation problem, so HiGHS's optimal
    vertex is integral."""
    n, width = len(regions), slack + 1
    first = min(a for _, a in jobs)
    span = max(a for _, a in jobs) - first + width
    arrival: Any = np.asarray([a - first for _, a in jobs])
    job: Any = np.repeat(np.arange(len(jobs)), n * width)
    region = np.tile(np.repeat(np.arange(n), width), len(jobs))
    row = arrival[job] + np.tile(np.arange(width), len(jobs) * n)
    values = np.asarray([r.values[first : first + span] for r in regions], dtype=float)
    cost = values[region, row]
    var = np.arange(len(job))
    a_eq = coo_matrix((np.ones(len(var)), (job, var)), shape=(len(jobs), len(var))).tocsr()
    a_ub = coo_matrix((np.ones(len(var)), (region * span + row, var)), shape=(n * span, len(var))).tocsr()
    result = linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.full(n * span, slots, dtype=float),
        A_eq=a_eq,
        b_eq=np.ones(len(jobs)),
        bounds=(0, 1),
        method="highs",
    )
    if result.status != 0:
        raise RuntimeError(f"the spatial oracle's LP failed: {result.message}")
    x = result.x.reshape(len(jobs), n * width)
    if not np.allclose(x.max(axis=1), 1.0, atol=1e-6):
        raise RuntimeError("the spatial oracle's LP has a fractional optimum")
    picks = x.argmax(axis=1)
    return [(int(p) // width, first + int(arrival[j]) + int(p) % width) for j, p in enumerate(picks)]
