"""lowtide: no-op tasks/s, the figure the peers' numbers are compared with.

`tasks_per_s` is the drain figure (tasks submitted first, then the workers connect and work
them off), the way the peers are measured; `end_to_end_tasks_per_s` is submit -> complete with
the workers already connected and tasks submitted while they work. See `bench.lowtide_run`.
"""

from __future__ import annotations

from bench import lowtide_run


async def run_lowtide(database_url: str, tasks: int) -> dict[str, object]:
    result = await lowtide_run.run(database_url, tasks)
    end_to_end = result.pop("tasks_per_s")
    result["end_to_end_tasks_per_s"] = end_to_end
    result["tasks_per_s"] = result.pop("drain_tasks_per_s")
    result["settings"] = {
        "workers": lowtide_run.WORKERS,
        "slots_per_worker": lowtide_run.SLOTS,
        "submit": "SubmitTasks, 1000 tasks a call",
        "worker": "lowtide demo-worker --types echo (async no-op returning its payload)",
    }
    return result
