"""What the Procrastinate and PgQueuer benchmarks share: the sequence of runs and the report."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version

from bench import _pg
from bench._fleet import Progress, Run, drain_with_workers


@dataclass(frozen=True)
class Peer:
    """A queue library under test.

    `name` is also its distribution name and its databases' prefix. `prepare(database_url,
    tasks)` installs the schema and loads the jobs, returning how long loading took (reported,
    not timed as work). `worker_argv` is the worker module's command line.
    """

    name: str
    worker_module: str
    settings: Mapping[str, object]
    progress: Progress
    prepare: Callable[[str, int], Awaitable[float]]
    worker_argv: Sequence[str]


async def run_peer(
    peer: Peer, server_url: str, *, tasks: int, processes: Sequence[int], repeat: int, timeout_s: float
) -> dict[str, object]:
    """Time every process count `repeat` times, each run in a database of its own."""
    runs: list[dict[str, object]] = []
    best: Run | None = None
    for _ in range(repeat):
        for count in processes:
            # A fresh database per run: no run inherits another's dead rows, bloat or stats.
            async with _pg.throwaway_database(server_url, f"bench_{peer.name}") as database_url:
                print(f"[{peer.name}] loading {tasks} jobs", file=sys.stderr, flush=True)
                load_s = await peer.prepare(database_url, tasks)
                run = await drain_with_workers(
                    database_url=database_url,
                    module=peer.worker_module,
                    argv=peer.worker_argv,
                    processes=count,
                    tasks=tasks,
                    progress=peer.progress,
                    timeout_s=timeout_s,
                    label=peer.name,
                )
            runs.append({**run.as_json(), "load_s": round(load_s, 3)})
            if best is None or run.tasks_per_s > best.tasks_per_s:
                best = run
    assert best is not None
    return {
        "version": version(peer.name),
        "settings": dict(peer.settings),
        "runs": runs,
        # Best rather than mean: on a shared machine noise only ever slows a run down.
        "best_tasks_per_s": round(best.tasks_per_s, 1),
        "best_processes": best.processes,
    }
