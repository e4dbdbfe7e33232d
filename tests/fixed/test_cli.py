"""Fixed starts from the command line: submit with a start, a conflict printed, pools in status."""

from __future__ import annotations

import json

from scheduler_service.server import Scheduler
from tests.cost.test_cli import lowtide


async def test_submit_a_fixed_start_see_a_conflict_and_the_pool_in_status(fixed_scheduler: Scheduler) -> None:
    target = fixed_scheduler.target
    args = ["task", "submit", "job", "--pool", "one", "--start-in", "10m", "--estimated-duration", "5m"]
    code, text = await lowtide(*args, "--target", target, "--json")
    assert code == 0
    task = json.loads(text)
    assert (task["pool"], task["state"], task["on_miss"]) == ("one", "pending", "MISS_POLICY_RUN_LATE")
    code, text = await lowtide(*args, "--tolerance", "0s", "--on-miss", "skip", "--target", target)
    assert code == 1
    assert "FAILED_PRECONDITION: reservation conflict in pool one" in text
    assert "pool:      one (at most 1 overlapping reservation(s))" in text
    assert f"(tasks {task['id']})" in text
    code, text = await lowtide("status", "--target", target)
    [row] = [line.split() for line in text.splitlines() if line.startswith("one ")]
    # pool, workers, slots, busy, held, reserved ahead, hit rate, desired
    assert row[5:] == ["1", "-", "1"]
