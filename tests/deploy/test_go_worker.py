"""The Go worker in clients/go, built by its build.sh from protos/ with Debian's Go toolchain
(protoc-gen-go, protoc-gen-go-grpc), runs `echo` and the typed `total` (a Python dataclass in, a
dataclass back) against a real scheduler, outlives an activity that panics, and drains on
SIGTERM. Debian's toolchain is installed for it when missing (tests/deploy/go_toolchain.py);
skipped, saying why, where that cannot be done."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from lowtide_client import Client, TaskState
from scheduler_service.server import Scheduler
from tests.deploy import go_toolchain
from tests.deploy.node import run_bounded

GO_DIR = Path(__file__).resolve().parents[2] / "clients" / "go"
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
FAILED = TaskState.Value("TASK_STATE_FAILED")


@dataclass
class Scores:
    name: str
    values: list[float]


@dataclass
class Total:
    name: str
    total: float
    count: int


def total(scores: Scores) -> Total:
    """Runs on the Go worker; here only its signature is used to submit."""
    raise NotImplementedError


def average(values: list[int]) -> int:
    """Runs on the Go worker (and panics there on an empty list)."""
    raise NotImplementedError


def _toolchain_or_skip() -> None:
    problem = go_toolchain.why_not()
    if problem:
        pytest.skip(problem)


async def test_the_go_worker_runs_echo_and_a_typed_activity(scheduler: Scheduler, tmp_path: Path) -> None:
    _toolchain_or_skip()
    binary = tmp_path / "lowtide-go-worker"
    code, out, err = await run_bounded(
        str(GO_DIR / "build.sh"), str(binary), cwd=GO_DIR, env=go_toolchain.build_env(), within=300
    )
    assert code == 0, f"build.sh failed ({code}):\n{out}\n{err}"
    worker = await asyncio.create_subprocess_exec(
        str(binary),
        env={"LOWTIDE_TARGET": scheduler.target, "LOWTIDE_SLOTS": "2"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with Client(scheduler.target) as client:
            tasks = [await client.submit("echo", f"from go {i}".encode()) for i in range(3)]
            done = [await client.wait(task.id, timeout=timedelta(seconds=30)) for task in tasks]
        if any(t.state != COMPLETED for t in done):
            if worker.returncode is None:
                worker.kill()
            pytest.fail(f"tasks not completed: {done}; worker said: {(await worker.communicate())[1].decode()}")
        assert [t.result for t in done] == [f"from go {i}".encode() for i in range(3)]
        async with Client(scheduler.target) as client:
            submitted = await client.submit(total, Scores(name="go", values=[1.5, 2, 3]))
            summed = await submitted.result(timeout=timedelta(seconds=30))
        assert summed == Total(name="go", total=6.5, count=3)
        async with Client(scheduler.target) as client:
            # A panic (integer division by zero) fails its attempt; the worker runs on.
            empty = await client.submit(average, [], max_attempts=1)
            failed = await client.wait(empty.id, timeout=timedelta(seconds=30))
            assert (failed.state, failed.last_failure.error_type) == (FAILED, "Panic"), failed
            assert "the activity panicked: runtime error: integer divide by zero" in failed.last_failure.message
            assert await (await client.submit(average, [2, 4])).result(timeout=timedelta(seconds=30)) == 3
        assert worker.returncode is None
        worker.send_signal(signal.SIGTERM)
        out_bytes, err_bytes = await asyncio.wait_for(worker.communicate(), 30)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, err_bytes.decode()
    assert f"connected to {scheduler.target}" in out_bytes.decode()
