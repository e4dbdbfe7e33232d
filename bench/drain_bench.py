"""The drain, side by side on the same PostgreSQL: 20,000 and 100,000 pre-submitted no-op tasks
worked off by lowtide with 4 worker processes x 64 slots, by lowtide with 64 workers x 4 slots
(16 streams in each of 4 processes), and by PgQueuer 1.6 with its best settings (see
bench.pgqueuer_bench; 2 consumer processes, the best of 1, 2 and 4 in earlier runs). Targets
(issue 15): lowtide 4 x 64 at least 1.2 x PgQueuer at both sizes; 64 x 4 within 15 % of 4 x 64.

The three runs of a size are made in rounds (ROUNDS, or more with --repeat), each round in a
different order: on a shared machine the speed drifts over minutes (the same code drained 9k and
17k tasks/s a quarter of an hour apart), so a ratio is taken within a round, where the runs are
a minute apart, and the report gives every round's ratios and their median. Each run also says
where its CPU went, per task: the scheduler, the workers and PostgreSQL (bench._cpu).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from bench import lowtide_run
from bench._pg import throwaway_database
from bench.pgqueuer_bench import run_pgqueuer

BACKLOGS = (20_000, 100_000)
ROUNDS = 3
PGQUEUER_PROCESSES = (2,)
SHAPES = {"4x64": (4, 1, 64), "64x4": (4, 16, 4)}  # processes, workers per process, slots per worker


async def _lowtide(server_url: str, tasks: int, shape: str) -> tuple[float, Any]:
    processes, per_process, slots = SHAPES[shape]
    async with throwaway_database(server_url, "bench_drain") as url:
        run = await lowtide_run.drain(url, tasks, processes=processes, per_process=per_process, slots=slots)
    return float(run["drain_tasks_per_s"]), run["cpu_us_per_task"]


async def _round(server_url: str, tasks: int, nth: int, timeout_s: float) -> dict[str, Any]:
    """One run of each contender, starting with a different one each round."""

    async def pgqueuer() -> tuple[float, Any]:
        peer = await run_pgqueuer(server_url, tasks=tasks, processes=PGQUEUER_PROCESSES, repeat=1, timeout_s=timeout_s)
        (run,) = cast(list[dict[str, Any]], peer["runs"])
        return float(cast(float, peer["best_tasks_per_s"])), run["cpu_us_per_task"]

    runs: dict[str, Callable[[], Awaitable[tuple[float, Any]]]] = {
        "lowtide_4x64": lambda: _lowtide(server_url, tasks, "4x64"),
        "lowtide_64x4": lambda: _lowtide(server_url, tasks, "64x4"),
        "pgqueuer": pgqueuer,
    }
    names = list(runs)
    order = names[nth % len(names) :] + names[: nth % len(names)]
    made: dict[str, tuple[float, Any]] = {}
    for name in order:
        made[name] = await runs[name]()
        print(f"[drain] {tasks} tasks, round {nth + 1}, {name}: {made[name][0]:.0f}/s", file=sys.stderr, flush=True)
    figures: dict[str, Any] = {f"{name}_tasks_per_s": round(made[name][0]) for name in names}
    figures["lowtide_vs_pgqueuer"] = round(figures["lowtide_4x64_tasks_per_s"] / figures["pgqueuer_tasks_per_s"], 3)
    figures["64x4_vs_4x64"] = round(figures["lowtide_64x4_tasks_per_s"] / figures["lowtide_4x64_tasks_per_s"], 3)
    for name in names:
        figures[f"{name}_cpu_us_per_task"] = made[name][1]
    return figures


async def drain(server_url: str, *, timeout_s: float, rounds: int = ROUNDS) -> dict[str, Any]:
    report: dict[str, Any] = {
        "shapes": {k: {"processes": p, "workers": p * w, "slots": s} for k, (p, w, s) in SHAPES.items()},
        "rounds": rounds,
    }
    for tasks in BACKLOGS:
        made = [await _round(server_url, tasks, nth, timeout_s) for nth in range(rounds)]
        report[str(tasks)] = {
            "median": {name: _median(r[name] for r in made) for name in made[0]},
            "rounds": made,
        }
    return report


def _median(figures: Iterable[Any]) -> Any:
    """The median of a figure over the rounds; of a CPU breakdown, per role (None where a round
    measured none)."""
    values = list(figures)
    if any(v is None for v in values):
        return None
    if isinstance(values[0], dict):
        return {role: round(statistics.median(v[role] for v in values), 1) for role in values[0]}
    return statistics.median(values)
