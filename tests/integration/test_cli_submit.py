"""`lowtide task submit` and `task cancel` as a user types them, against a real scheduler and
worker: headers and JSON payloads, why a task waits said at once, a past deadline and a heartbeat
timeout no worker can keep refused by name, and a cancel that cancels nothing said so."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import Scheduler
from tests.integration.test_cli import lowtide, stored

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
PENDING = TaskState.Value("TASK_STATE_PENDING")


@dataclass
class Scores:
    values: list[float]


@pytest.fixture
async def worker(scheduler: Scheduler) -> AsyncIterator[Worker]:
    """A Python worker running `total` (typed: JSON in, JSON out) and `echo` (raw bytes)."""
    running = Worker(target=scheduler.target, slots=4)

    @running.activity("total")
    def total(scores: Scores) -> float:
        return sum(scores.values)

    @running.activity("echo")
    def echo(payload: bytes) -> bytes:
        return payload

    async with running:
        yield running


async def test_headers_and_a_json_payload_reach_a_json_worker(scheduler: Scheduler, worker: Worker) -> None:
    run = await lowtide(
        "task", "submit", "total", "--json-payload", "--payload", '{"values": [1.5, 2]}',
        "--header", "tenant=acme", "--header", "Traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "--target", scheduler.target, "--json",
    )  # fmt: skip
    assert run.code == 0, run.err
    task = json.loads(run.out)
    assert (task["state"], task["result"]) == ("completed", "3.5")
    assert task["headers"] == {
        "content-type": "application/json",
        "tenant": "acme",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json-payload", "--payload", "{not json"], "--payload: is not JSON, which --json-payload sends"),
        (["--header", "novalue"], "argument --header: expected KEY=VALUE"),
        (["--header", "=x"], "argument --header: expected KEY=VALUE"),
        (
            ["--json-payload", "--header", "content-type=text/plain", "--payload", "1"],
            "--json-payload: sends content-type: application/json, but --header says 'text/plain'",
        ),
    ],
)
async def test_a_bad_header_or_json_payload_is_refused_before_anything_is_stored(
    scheduler: Scheduler, args: list[str], message: str
) -> None:
    run = await lowtide("task", "submit", "total", *args, "--target", scheduler.target)
    assert run.code == 2 and message in run.err.splitlines()[-1], run.err
    assert await stored(scheduler.target) == []


async def test_a_task_no_worker_runs_says_why_at_once_on_stderr(scheduler: Scheduler) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lowtide", "task", "submit", "nobody-runs-this", "--wait-timeout", "60s",
        "--target", scheduler.target,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert process.stderr is not None
        began = time.monotonic()
        line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
        # At once, while the command still waits (up to a minute) for the task to finish.
        assert time.monotonic() - began < 30 and process.returncode is None
        [task_id] = await stored(scheduler.target)
        assert line == (
            f"lowtide: task {task_id} is pending: no connected worker runs activity type nobody-runs-this on "
            "queue default\n"
        )
    finally:
        process.kill()
        await process.wait()


async def test_a_fixed_start_no_worker_runs_yet_says_nothing_on_stderr(scheduler: Scheduler) -> None:
    args = ["nobody-runs-this", "--start-in", "10m", "--estimated-duration", "1m", "--json"]
    run = await lowtide("task", "submit", *args, "--target", scheduler.target)
    assert (run.code, run.err) == (0, "")
    assert json.loads(run.out)["state"] == "pending"


async def test_a_task_a_worker_runs_says_nothing_on_stderr(scheduler: Scheduler, worker: Worker) -> None:
    run = await lowtide("task", "submit", "echo", "--payload", "hi", "--target", scheduler.target)
    assert (run.code, run.err) == (0, "")
    assert "completed" in run.out


async def test_cancelling_a_task_that_has_ended_says_nothing_was_cancelled(
    scheduler: Scheduler, worker: Worker
) -> None:
    async with Client(scheduler.target) as client:
        done = await client.submit("echo", b"x")
        assert (await client.wait(done.id, timeout=timedelta(seconds=30))).state == COMPLETED
    run = await lowtide("task", "cancel", str(done.id), "--target", scheduler.target)
    assert run.code == 1
    assert run.err == f"lowtide: task {done.id} was not cancelled: it had already ended (completed)\n"
    assert f"task {done.id} completed" in run.out
    async with Client(scheduler.target) as client:
        waiting = await client.submit("nobody-runs-this")
    run = await lowtide("task", "cancel", str(waiting.id), "--target", scheduler.target)
    assert (run.code, run.err) == (0, "")
    assert f"task {waiting.id} cancelled" in run.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--deadline", "2020-01-01T00:00:00Z"],
            "lowtide: INVALID_ARGUMENT: deadline: 2020-01-01T00:00:00+00:00 is in the past",
        ),
        (
            ["--latest-start", "2020-01-01T00:00:00Z"],
            "lowtide: INVALID_ARGUMENT: latest_start: 2020-01-01T00:00:00+00:00 is in the past",
        ),
        (
            ["--heartbeat-timeout", "1ms"],
            "lowtide: INVALID_ARGUMENT: heartbeat_timeout: must be at least 1s, not 1ms: a worker heartbeats "
            "every third of it",
        ),
    ],
)
async def test_a_past_deadline_or_a_heartbeat_timeout_no_worker_can_keep_is_refused_by_name(
    scheduler: Scheduler, args: list[str], message: str
) -> None:
    run = await lowtide("task", "submit", "echo", *args, "--target", scheduler.target)
    assert run.code == 1 and run.err.startswith(message), run.err
    assert await stored(scheduler.target) == []
