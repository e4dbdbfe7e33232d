"""The cost-hold commands as a user types them: explain, queue pause/resume, status."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from lowtide_client import Client
from tests.cost.conftest import Pair


async def lowtide(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lowtide", *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode or 0, out.decode()


async def test_explain_pause_resume_and_status(pair: Pair) -> None:
    target = pair.scheduler.target
    await pair.set_signal(520)
    async with Client(target) as client:
        task = await client.submit("train")
    code, text = await lowtide("task", "explain", str(task.id), "--target", target)
    assert code == 0
    assert f"task {task.id}: held: activity type train is cost-deferrable and signal grid is 520" in text
    code, text = await lowtide("task", "explain", str(task.id), "--target", target, "--json")
    explained = json.loads(text)
    assert explained["state"] == "pending" and explained["reasons"][0] == "cost_hold"

    code, text = await lowtide("queue", "pause", "default", "--target", target, "--json")
    assert code == 0 and json.loads(text)["paused"] is True
    code, text = await lowtide("status", "--target", target)
    assert code == 0
    assert "cost hold: ACTIVE (signal grid: 520, threshold 400)" in text
    [row] = [line for line in text.splitlines() if line.startswith("default ")]
    assert row.split()[:2] == ["default", "yes"] and row.split()[-1] == "train"
    code, text = await lowtide("queue", "resume", "default", "--target", target, "--json")
    assert code == 0 and json.loads(text)["paused"] is False


async def test_explain_of_an_unknown_task_says_not_found(pair: Pair) -> None:
    code, text = await lowtide("task", "explain", "424242", "--target", pair.scheduler.target)
    assert code == 1 and "NOT_FOUND" in text and "424242" in text
