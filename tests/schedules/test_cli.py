"""`lowtide schedule create|list|pause|resume|delete` as a user runs them, against a real scheduler."""

from __future__ import annotations

import json

from scheduler_service.server import Scheduler
from tests.cost.test_cli import lowtide
from tests.helpers import eventually


async def test_schedule_commands(scheduled: Scheduler) -> None:
    target = ("--target", scheduled.target)
    code, text = await lowtide(
        "schedule", "create", "reports", "--cron", "*/5 * * * *", "--tz", "Europe/London", "--type", "report",
        "--pool", "ten", "--payload", "weekly", "--tolerance", "2s", "--on-miss", "skip",
        "--estimated-duration", "90s", *target,
    )  # fmt: skip
    assert code == 0, text
    assert text.startswith("schedule reports active cron='*/5 * * * *' tz=Europe/London type=report pool=ten next=")

    async def created() -> dict[str, object]:
        code, text = await lowtide("schedule", "list", "--json", *target)
        assert code == 0, text
        [listed] = [json.loads(line) for line in text.splitlines()]
        assert isinstance(listed, dict)
        return listed if listed["last_task_id"] else {}

    listed = await eventually(created, within=20)
    assert listed["name"] == "reports" and listed["payload"] == "weekly"
    assert (listed["on_miss"], listed["start_tolerance"], listed["estimated_duration"]) == (
        "MISS_POLICY_SKIP",
        "2s",
        "90s",
    )
    assert listed["conflicts"] == 0 and listed["last_conflict"] == ""

    code, text = await lowtide("schedule", "pause", "reports", *target)
    assert code == 0, text
    assert text.startswith("schedule reports paused; cancelled ") and "task(s) not yet started" in text
    code, text = await lowtide("schedule", "list", *target)
    assert text.startswith("schedule reports paused cron=")
    code, text = await lowtide("schedule", "resume", "reports", "--json", *target)
    assert code == 0 and json.loads(text)["paused"] is False
    code, text = await lowtide("schedule", "delete", "reports", "--json", *target)
    assert code == 0 and json.loads(text)["name"] == "reports"
    code, text = await lowtide("schedule", "list", *target)
    assert (code, text) == (0, "")
    code, text = await lowtide("schedule", "delete", "reports", *target)
    assert code == 1 and "NOT_FOUND: schedule 'reports' not found" in text


async def test_bad_cron_and_time_zone_are_refused_naming_the_field(scheduled: Scheduler) -> None:
    target = ("--target", scheduled.target)
    base = ("schedule", "create", "x", "--type", "report", "--estimated-duration", "1m")
    code, text = await lowtide(*base, "--cron", "* * 32 * *", *target)
    assert code == 1 and "INVALID_ARGUMENT: cron: day-of-month: 32 is out of range 1-31" in text
    code, text = await lowtide(*base, "--cron", "* * * * *", "--tz", "Nowhere/Special", *target)
    assert code == 1 and "INVALID_ARGUMENT: time_zone: unknown time zone 'Nowhere/Special'" in text
    code, text = await lowtide(*base, "--cron", "* * * * *", "--json", *target)
    assert code == 0 and json.loads(text)["time_zone"] == "UTC"
