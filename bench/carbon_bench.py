"""Carbon saved by planned release, on a grid trace (by default the 2020 Great Britain one).

The trace is resampled to 30-minute rows (the mean of the rows in each half hour: the GB trace
has 15-minute rows from November). A 30-minute job arrives on every row of the sample (blocks
of consecutive days spread over the trace; the whole year is slow to re-plan in Python) and may
wait `slack` (4 h, 8 h, 24 h) before it starts. The carbon of a job is the trace's true value
over its run; every job draws the same power, so a saving is the relative drop of the summed
values against starting every job at arrival.

Policies (see bench/_carbon_sim.py): the project's `plan()` planned once at arrival and
re-planned on every new forecast (as the scheduler does), on a pool of 2 and 4 slots and an
unbounded one; the oracle limited to the same pool (exact LP) and the unbounded oracle; the
threshold hold. Forecasts (48 hours, a new one each row, seeded; the current value known):
5 % and 15 % i.i.d. error, and the horizon-growing correlated model with ramps shifted in time
(`lowtide.forecast_error.HorizonError`: 3 % at 1 h to 15 % at 24 h, AR(1) rho 0.9 per half
hour, time shift of 1 h at 24 h); every forecast point states the model's expected error.

`ratio` is policy saving / saving of the oracle with the same pool (pool_2 and pool_4 against the
pool-limited oracle, unbounded against the unbounded one). Waits are in hours; `late` counts
jobs started after their latest start. The GB trace is from Wiesner et al., "Let's Wait Awhile:
How Temporal Workload Shifting Can Reduce Carbon Emissions in the Cloud" (Middleware 2021).
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, timedelta
from typing import Any

from bench._carbon_sim import (
    ROW,
    Forecasts,
    ForecastSource,
    Learned,
    Rows,
    costs,
    oracle_pool,
    oracle_unbounded,
    planned_once,
    replanned,
    threshold,
)
from lowtide.forecast_error import ErrorModel, HorizonError, IidError
from signal_service.feeds.replay import load_trace

SLACKS_H = (4, 8, 24)
POOLS: tuple[int | None, ...] = (2, 4, None)
MODELS: dict[str, ErrorModel] = {
    "iid_5pct": IidError(0.05),
    "iid_15pct": IidError(0.15),
    "horizon": HorizonError(),
    "horizon_ar1": HorizonError(shift_at_24h=timedelta(0)),
}
# Each policy and what its forecasts state: the model's error (`planned_once`, `replanned`),
# none (`replanned_blind`: what real feeds give), or what the calibration learned from the
# forecasts issued before (`replanned_learned`).
MODES = ("planned_once", "replanned", "replanned_blind", "replanned_learned")
# The calibration's record starts this long before each block's first plan.
HISTORY_ROWS = 14 * 48
# And is learned again every this many rows (a day).
LEARN_ROWS = 48
PERCENTILES = (10, 30, 50)
SEED = 2020
# The sample: this many blocks of consecutive days, spread evenly over the trace (after a week
# of history for the threshold hold, and leaving three days at the end for the slack and the
# forecast horizon).
BLOCKS = 4
BLOCK_DAYS = 14


def resample(trace: list[tuple[Any, float]]) -> Rows:
    """Half-hour means of the trace's rows, on :00 and :30 UTC; a half hour with no row holds
    the last value."""
    bins: dict[Any, list[float]] = {}
    for when, value in trace:
        at = when.astimezone(UTC)
        start = at.replace(minute=30 * (at.minute // 30), second=0, microsecond=0)
        bins.setdefault(start, []).append(value)
    first, last = min(bins), max(bins)
    times, values = [], []
    at, held = first, statistics.fmean(bins[first])
    while at <= last:
        if at in bins:
            held = statistics.fmean(bins[at])
        times.append(at)
        values.append(held)
        at += ROW
    return Rows(times, values)


def sample(rows: Rows, blocks: int = BLOCKS, days: int = BLOCK_DAYS) -> list[range]:
    per_day = 48
    lo, hi = 7 * per_day, len(rows.times) - 3 * per_day
    length = min(days * per_day, (hi - lo) // blocks)
    if length < per_day:
        raise ValueError("the trace is too short for the carbon evaluation (it needs about 11 days)")
    gap = (hi - lo - blocks * length) // max(1, blocks - 1) if blocks > 1 else 0
    return [range(lo + b * (length + gap), lo + b * (length + gap) + length) for b in range(blocks)]


def carbon_evaluation(
    trace_file: str = "",
    *,
    blocks: int = BLOCKS,
    days: int = BLOCK_DAYS,
    models: Sequence[str] = tuple(MODELS),
    modes: Sequence[str] = MODES,
    cold: bool = False,
) -> dict[str, Any]:
    """Every cell of `models` x `modes` (all by default) over `blocks` blocks of `days` days; `cold`:
    the learned cells' record starts empty at each block and is learned again on every row, as a
    new deployment's (else it starts `HISTORY_ROWS` before and is learned again every `LEARN_ROWS`)."""
    began = time.perf_counter()
    rows = resample([(p.at, p.value) for p in load_trace(trace_file)])
    arrivals = sample(rows, blocks, days)
    jobs = sum(len(r) for r in arrivals)
    baseline = sum(costs(rows, r) for r in arrivals)
    if baseline <= 0:
        # A price trace may go below zero; a saving in percent of a cost that is not above 0 says nothing.
        raise ValueError(f"the trace's mean over the sampled days is {baseline / jobs:g}: savings need it above 0")
    sources = _sources(rows, arrivals, models, cold=cold)

    def run(policy: Callable[[range, int], list[int]], slack: int) -> tuple[float, list[int]]:
        waits: list[int] = []
        total = 0.0
        late = 0
        for block in arrivals:
            starts = policy(block, slack)
            total += costs(rows, starts)
            waits += [s - a for s, a in zip(starts, block, strict=True)]
            late += sum(s - a > slack for s, a in zip(starts, block, strict=True))
        return 1 - total / baseline, [late, *waits]

    results: dict[str, Any] = {
        "trace": trace_file or "bundled gb_2020_carbon_intensity.csv",
        "rows": "30 min (resampled)",
        "sample": [f"{rows.times[r.start]:%Y-%m-%d} +{len(r) // 48}d" for r in arrivals],
        "record": "cold" if cold else f"{HISTORY_ROWS // 48} days before each block",
        "jobs": jobs,
        "baseline_mean": round(baseline / jobs, 2),
    }
    for slack_h in SLACKS_H:
        slack = slack_h * 2
        entry: dict[str, Any] = {}
        oracles: dict[str, float] = {}
        for pool in POOLS:
            key = f"pool_{pool}" if pool else "unbounded"
            if pool:
                got, _ = run(functools.partial(_blockwise, oracle_pool, rows, pool=pool), slack)
            else:
                got, _ = run(functools.partial(oracle_unbounded, rows), slack)
            oracles[key] = got
            entry[f"oracle_{key}_saving_pct"] = round(100 * got, 2)
        for name in models:
            cells: dict[str, Any] = {}
            for mode in modes:
                policy = planned_once if mode == "planned_once" else replanned
                for pool in POOLS:
                    key = f"pool_{pool}" if pool else "unbounded"

                    def one(
                        b: range, s: int, p: int | None = pool, f: Any = policy, m: Any = (name, mode)
                    ) -> list[int]:
                        return list(f(rows, b, s, p, sources[m][arrivals.index(b)]))

                    got, (late, *waits) = run(one, slack)
                    cells[f"{mode}_{key}"] = figures(got, oracles[key], late, waits)
            entry[name] = cells
        for p in PERCENTILES:
            got, (late, *waits) = run(functools.partial(threshold, rows, percentile=p), slack)
            entry[f"threshold_p{p}"] = figures(got, oracles["unbounded"], late, waits)
        results[f"slack_{slack_h}h"] = entry
        print(f"[carbon] slack {slack_h} h done after {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    results["elapsed_s"] = round(time.perf_counter() - began, 2)
    return results


def _sources(
    rows: Rows, arrivals: Sequence[range], models: Sequence[str], *, cold: bool
) -> dict[tuple[str, str], list[ForecastSource]]:
    """Each (model, mode)'s forecasts, a source per block of `arrivals`."""
    sources: dict[tuple[str, str], list[ForecastSource]] = {}
    for name in models:
        per_block = [Forecasts(rows, MODELS[name], f"{SEED}:{name}:{i}") for i in range(len(arrivals))]
        sources[name, "planned_once"] = sources[name, "replanned"] = list(per_block)
        sources[name, "replanned_blind"] = [f.blind() for f in per_block]
        sources[name, "replanned_learned"] = [
            Learned(rows, f, block.start, history=0 if cold else HISTORY_ROWS, every=1 if cold else LEARN_ROWS)
            for f, block in zip(per_block, arrivals, strict=True)
        ]
    return sources


def _blockwise(oracle: Callable[..., list[int]], rows: Rows, block: range, slack: int, pool: int) -> list[int]:
    return oracle(rows, block, slack, pool)


def figures(saving: float, best: float, late: int, waits: list[int]) -> dict[str, Any]:
    ordered = sorted(waits)
    p99 = ordered[min(len(ordered) - 1, -(-99 * len(ordered) // 100) - 1)]
    return {
        "saving_pct": round(100 * saving, 2),
        "ratio": round(saving / best, 3) if best > 0 else None,
        "mean_wait_h": round(statistics.fmean(waits) / 2, 2),
        "p99_wait_h": p99 / 2,
        "late": late,
    }
