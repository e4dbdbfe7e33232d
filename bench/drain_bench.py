"""The drain, side by side on the same PostgreSQL: 20,000 and 100,000 pre-submitted no-op tasks
worked off by lowtide with 4 worker processes x 64 slots, by lowtide with 64 workers x 4 slots
(16 streams in each of 4 processes), and by PgQueuer 1.6 with its best settings (see
bench.pgqueuer_bench; 2 consumer processes, the best of 1, 2 and 4 in earlier runs). Targets
(issue 15): lowtide 4 x 64 at least 1.2 x PgQueuer at both sizes; 64 x 4 within 15 % of 4 x 64.
"""

from __future__ import annotations

import sys
from typing import Any

from bench import lowtide_run
from bench._pg import throwaway_database
from bench.pgqueuer_bench import run_pgqueuer

BACKLOGS = (20_000, 100_000)
PGQUEUER_PROCESSES = (2,)
SHAPES = {"4x64": (4, 1, 64), "64x4": (4, 16, 4)}  # processes, workers per process, slots per worker


async def drain(server_url: str, *, timeout_s: float) -> dict[str, Any]:
    report: dict[str, Any] = {
        "shapes": {k: {"processes": p, "workers": p * w, "slots": s} for k, (p, w, s) in SHAPES.items()}
    }
    for tasks in BACKLOGS:
        figures: dict[str, Any] = {}
        for shape, (processes, per_process, slots) in SHAPES.items():
            async with throwaway_database(server_url, "bench_drain") as url:
                run = await lowtide_run.drain(url, tasks, processes=processes, per_process=per_process, slots=slots)
            figures[f"lowtide_{shape}_tasks_per_s"] = run["drain_tasks_per_s"]
            print(f"[drain] {tasks} tasks, lowtide {shape}: {run['drain_tasks_per_s']} tasks/s", file=sys.stderr)
        peer = await run_pgqueuer(server_url, tasks=tasks, processes=PGQUEUER_PROCESSES, repeat=1, timeout_s=timeout_s)
        figures["pgqueuer_tasks_per_s"] = peer["best_tasks_per_s"]
        figures["lowtide_vs_pgqueuer"] = round(figures["lowtide_4x64_tasks_per_s"] / peer["best_tasks_per_s"], 3)
        figures["64x4_vs_4x64"] = round(figures["lowtide_64x4_tasks_per_s"] / figures["lowtide_4x64_tasks_per_s"], 3)
        report[str(tasks)] = figures
    return report
