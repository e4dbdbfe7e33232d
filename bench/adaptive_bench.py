"""Adaptive concurrency (issue 21): the done-when test's setup, measured.

A downstream that slows down and fails past N = 20 concurrent requests (tests/adaptive/
downstream.py), four worker processes of 50 slots calling it, a signal service and a scheduler
in this process. Each limit — adaptive (`min = 1, max = 200`) and `max_concurrency = 200` — gets
a database of its own and two phases:

- steady: STEADY_TASKS tasks submitted at once. Convergence time is from the submission to the
  first reading of the limit (every 250 ms) after which every reading of the phase stays within
  +-25 % of N; the settled limit is the median of those readings;
- release: HELD_TASKS tasks held by a cost hold, then released at once (the signal lowered).

For each: throughput (tasks finished per second, from submission or release to the last task
ended), the downstream's failure rate (its 503s over its requests) and its peak concurrency, and
the CPU seconds per task of this process (the scheduler, the signal service and the submitter).
Targets: settles within +-25 % of N within 30 s, failure rate under 5 %.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._pg import throwaway_database
from tests.adaptive.scenario import Phase, Setup, phase_figures, running, submit

N = 20
STEADY_TASKS = 4000
HELD_TASKS = 2000
BAND = 0.25


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _converged(readings: list[tuple[float, int]], began: float) -> tuple[float | None, float | None]:
    """Seconds from `began` to the reading after which all stay within the band, and their median."""
    low, high = N * (1 - BAND), N * (1 + BAND)
    inside_from: int | None = None
    for i, (_, value) in enumerate(readings):
        if low <= value <= high:
            if inside_from is None:
                inside_from = i
        else:
            inside_from = None
    if inside_from is None:
        return None, None
    settled = [v for _, v in readings[inside_from:]]
    return round(readings[inside_from][0] - began, 1), statistics.median(settled)


async def _until(condition: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {within_s:.0f}s")
        await asyncio.sleep(0.1)


async def _drained(setup: Setup, within_s: float) -> None:
    await _until(lambda: setup.unfinished() == 0, within_s, "every task finished")


def _figures(phase: Phase, cpu: float) -> dict[str, Any]:
    return {
        "tasks": phase.tasks,
        "seconds": round(phase.seconds, 1),
        "tasks_per_s": round(phase.throughput, 1),
        "downstream_requests": phase.requests,
        "downstream_failures": phase.failures,
        "failure_rate": round(phase.failure_rate, 4),
        "downstream_peak_concurrency": phase.peak,
        "process_cpu_s_per_task": round(cpu / phase.tasks, 5),
    }


async def _steady(setup: Setup, within_s: float) -> dict[str, Any]:
    await setup.reset()
    cpu, began = _cpu_seconds(), time.monotonic()
    await submit(setup, STEADY_TASKS)
    await _drained(setup, within_s)
    figures = _figures(await phase_figures(setup, STEADY_TASKS, began, began), _cpu_seconds() - cpu)
    readings = [(t, v) for t, v in setup.readings.values if t >= began]
    convergence, settled = _converged(readings, began)
    return {**figures, "convergence_s": convergence, "settled_limit": settled}


async def _release(setup: Setup, within_s: float) -> dict[str, Any]:
    await setup.set_signal(900.0)
    await _until(lambda: setup.scheduler.parts.holds.state.active, within_s, "the hold")
    await submit(setup, HELD_TASKS)
    await _until(lambda: setup.held() >= HELD_TASKS, within_s, "every task held")
    await setup.reset()
    limit_at_release = setup.limit()
    cpu, began = _cpu_seconds(), time.monotonic()
    await setup.set_signal(100.0)
    await _drained(setup, within_s)
    figures = _figures(await phase_figures(setup, HELD_TASKS, began, began), _cpu_seconds() - cpu)
    limits = setup.readings.since(began)
    return {**figures, "limit_at_release": limit_at_release, "max_limit_after_release": max(limits, default=None)}


async def _one(server_url: str, *, adaptive: bool, within_s: float) -> dict[str, Any]:
    label = "adaptive" if adaptive else "static"
    async with throwaway_database(server_url, f"lowtide_bench_{label}") as url:
        with tempfile.TemporaryDirectory(prefix="lowtide-adaptive-") as logs:
            async with running(url, Path(logs), adaptive=adaptive, capacity=N) as setup:
                print(f"[adaptive_concurrency] {label}: steady", file=sys.stderr, flush=True)
                steady = await _steady(setup, within_s)
                print(f"[adaptive_concurrency] {label}: release", file=sys.stderr, flush=True)
                released = await _release(setup, within_s)
    return {"steady": steady, "release": released}


async def adaptive_concurrency(server_url: str, timeout_s: float = 300.0) -> dict[str, Any]:
    adaptive = await _one(server_url, adaptive=True, within_s=timeout_s)
    static = await _one(server_url, adaptive=False, within_s=timeout_s)
    steady = adaptive["steady"]
    convergence, settled = steady["convergence_s"], steady["settled_limit"]
    return {
        "downstream_capacity": N,
        "adaptive": adaptive,
        "static_200": static,
        "targets": {
            "settles_within_25pct_in_30s": convergence is not None and convergence <= 30 and settled is not None,
            "failure_rate_under_5pct": steady["failure_rate"] < 0.05 and adaptive["release"]["failure_rate"] < 0.05,
        },
    }
