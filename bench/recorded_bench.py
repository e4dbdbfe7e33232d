"""Carbon saved by planned release on forecasts a real feed issued, not on generated ones.

`python -m bench carbon --forecasts FILE --actuals FILE`: an archive of issued forecasts
(`issued_at,target,forecast`) and the values that came (`target,actual`), half-hourly (by
default the bundled week of the UK Carbon Intensity API's national forecasts, March 2023). A
30-minute job arrives on every half hour from the first forecast on and may wait `slack`; every
half hour the jobs are planned on the newest forecast issued by then, the current value known.
The policies and figures are the generated evaluation's (bench/carbon_bench.py): planned once and
re-planned on forecasts that state the error measured for their lead over the whole archive
(`stated`: hindsight, as a feed that published its error would), re-planned on the bare forecasts
(`blind`), and re-planned with what lowtide.forecast_calibration learned from the forecasts issued
before each plan (`learned`, production's path: bias, error by lead, the caution that paid).
"""

from __future__ import annotations

import bisect
import csv
import functools
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench._carbon_sim import (
    ROW,
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
from bench.carbon_bench import MODES, PERCENTILES, POOLS, SLACKS_H, figures
from lowtide.forecast_calibration import Calibration, Issued, Record
from scheduler_service.domain.planning import CAUTION, Forecast


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.strip().replace("Z", "+00:00"))


def load_archive(forecasts_file: str | Path, actuals_file: str | Path) -> tuple[list[Issued], Rows]:
    """The issued forecasts in time order, and the actual values' longest gapless half-hourly run."""
    by_issue: dict[datetime, list[tuple[datetime, float]]] = {}
    with open(forecasts_file, newline="") as f:
        for row in csv.DictReader(f):
            by_issue.setdefault(_when(row["issued_at"]), []).append((_when(row["target"]), float(row["forecast"])))
    issued = [Issued(at, tuple(sorted(points))) for at, points in sorted(by_issue.items())]
    with open(actuals_file, newline="") as f:
        actuals = sorted((_when(row["target"]), float(row["actual"])) for row in csv.DictReader(f))
    runs: list[list[tuple[datetime, float]]] = [[]]
    for at, value in actuals:
        if runs[-1] and at - runs[-1][-1][0] != ROW:
            runs.append([])
        runs[-1].append((at, value))
    longest = max(runs, key=len)
    return issued, Rows([at for at, _ in longest], [v for _, v in longest])


class Recorded:
    """The archive's forecasts, each plan on the newest one issued by its row, the current value
    known; each point states `stated`'s error for its lead (None: no error)."""

    def __init__(self, rows: Rows, issued: Sequence[Issued], stated: Calibration | None = None) -> None:
        self._rows, self._issued, self._stated = rows, list(issued), stated
        self._stamps = [f.issued_at for f in self._issued]
        self._cache: dict[int, Forecast] = {}

    def first_row(self) -> int:
        return bisect.bisect_left(self._rows.times, self._stamps[0])

    def newest(self, k: int) -> Issued:
        return self._issued[bisect.bisect_right(self._stamps, self._rows.times[k]) - 1]

    def issued_on(self, k: int) -> Sequence[Issued]:
        at = self._rows.times[k]
        lo, hi = bisect.bisect_left(self._stamps, at), bisect.bisect_left(self._stamps, at + ROW)
        return self._issued[lo:hi]

    def at(self, k: int) -> Forecast:
        cached = self._cache.get(k)
        if cached is None:
            now, issued = self._rows.times[k], self.newest(k)
            error = self._stated.stddev if self._stated else (lambda _: 0.0)
            ahead = [(at, v, error(at - issued.issued_at)) for at, v in issued.points if at > now]
            cached = Forecast.of([(now, self._rows.values[k], 0.0), *ahead], end=issued.points[-1][0] + ROW)
            self._cache[k] = cached
        return cached

    def caution(self, k: int) -> float:
        return CAUTION


def recorded_evaluation(
    forecasts_file: str, actuals_file: str, *, modes: Sequence[str] = MODES, start_after: timedelta = timedelta(0)
) -> dict[str, Any]:
    """Every cell of `modes` on the archive, the jobs arriving (and the learned cells' record
    starting) every row from `start_after` after its first forecast."""
    began = time.perf_counter()
    issued, rows = load_archive(forecasts_file, actuals_file)
    hindsight = Record()
    for f in issued:
        hindsight.add_forecast(f)
    for at, value in zip(rows.times, rows.values, strict=True):
        hindsight.add_actual(at, value)
    hindsight.window = rows.times[-1] - rows.times[0]
    stated_errors = hindsight.learn(rows.times[-1])
    blind = Recorded(rows, issued)
    first = blind.first_row() + start_after // ROW
    if first >= len(rows.times) - max(SLACKS_H) * 2:
        raise ValueError(f"the archive's values end within {start_after} of its first forecast and the longest slack")
    sources: dict[str, ForecastSource] = {
        "planned_once": Recorded(rows, issued, stated_errors),
        "replanned": Recorded(rows, issued, stated_errors),
        "replanned_blind": blind,
        # Learned again on every forecast issued (every row): the archive is a week.
        "replanned_learned": Learned(rows, blind, first, history=0, every=1),
    }
    results: dict[str, Any] = {
        "forecasts": forecasts_file,
        "actuals": actuals_file,
        "issued": len(issued),
        "start_after_h": start_after / timedelta(hours=1),
        "rows": f"{rows.times[0]:%Y-%m-%d %H:%M} to {rows.times[-1]:%Y-%m-%d %H:%M} UTC, 30 min",
    }
    for slack_h in SLACKS_H:
        slack = slack_h * 2
        arrivals = range(first, len(rows.times) - slack)
        baseline = costs(rows, arrivals)

        def run(
            policy: Callable[[range, int], list[int]], s: int = slack, a: range = arrivals, base: float = baseline
        ) -> tuple[Any, ...]:
            starts = policy(a, s)
            waits = [st - ar for st, ar in zip(starts, a, strict=True)]
            return 1 - costs(rows, starts) / base, sum(w > s for w in waits), waits

        entry: dict[str, Any] = {"jobs": len(arrivals)}
        oracles: dict[str, float] = {}
        for pool in POOLS:
            key = f"pool_{pool}" if pool else "unbounded"
            oracle = (
                functools.partial(oracle_pool, rows, slots=pool) if pool else functools.partial(oracle_unbounded, rows)
            )
            got = run(oracle)
            oracles[key] = got[0]
            entry[f"oracle_{key}_saving_pct"] = round(100 * got[0], 2)
        for mode in modes:
            policy = planned_once if mode == "planned_once" else replanned
            for pool in POOLS:
                key = f"pool_{pool}" if pool else "unbounded"
                saving, late, waits = run(functools.partial(policy, rows, slots=pool, forecasts=sources[mode]))
                entry[f"{mode}_{key}"] = figures(saving, oracles[key], late, waits)
        for p in PERCENTILES:
            saving, late, waits = run(functools.partial(threshold, rows, percentile=p))
            entry[f"threshold_p{p}"] = figures(saving, oracles["unbounded"], late, waits)
        results[f"slack_{slack_h}h"] = entry
        print(f"[carbon] recorded, slack {slack_h} h done after {time.perf_counter() - began:.0f} s", file=sys.stderr)
    results["elapsed_s"] = round(time.perf_counter() - began, 2)
    return results
