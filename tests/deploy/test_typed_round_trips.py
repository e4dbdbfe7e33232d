"""Typed tasks across languages against a real scheduler: a Python client submits a dataclass
that a Node worker gets as parsed JSON and answers with an object the Python client reads back
as a dataclass; a Node client submits a plain object that a Python activity gets as a dataclass.
The wire stays bytes; `content-type: application/json` in the task's headers says how to read
them (protos/lowtide/v1/task.proto, TaskSpec.payload). And a Node activity's context: its attempt
and deadline, heartbeat details shown by `lowtide task get`, a logger line with its task id, and
a cancel it sees through ctx.signal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from lowtide_client import Client, Worker
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.server import Scheduler
from tests.deploy.conftest import run_lowtide
from tests.deploy.node import ensure_node_modules, node_or_skip, run_bounded
from tests.helpers import eventually

SCRIPT = Path(__file__).with_name("typed_node.js")


@dataclass
class TrainParams:
    learning_rate: float
    epochs: int
    tags: list[str] = field(default_factory=list)


@dataclass
class TrainResult:
    loss: float
    seen: str
    tags: list[str]


def train(params: TrainParams) -> TrainResult:
    """Runs on the Node worker (typed_node.js); here only its signature is used to submit."""
    raise NotImplementedError


@dataclass
class Weight:
    weight: int


@dataclass
class ScoreParams:
    name: str
    values: list[float]
    nested: Weight


@dataclass
class Score:
    name: str
    total: float
    kind: str


async def score(params: ScoreParams) -> Score:
    kind = f"{type(params).__name__}/{type(params.nested).__name__}"
    return Score(name=params.name, total=sum(params.values) * params.nested.weight, kind=kind)


async def test_a_python_dataclass_submit_runs_on_a_node_worker_and_comes_back_typed(scheduler: Scheduler) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    process = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        "worker",
        env=dict(os.environ, LOWTIDE_TARGET=scheduler.target),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 20)
        assert line.strip() == b"welcome", line
        async with Client(scheduler.target) as client:
            submitted = await client.submit(train, TrainParams(learning_rate=0.5, epochs=4, tags=["a", "b"]))
            assert submitted.task.headers["content-type"] == "application/json"
            result = await submitted.result(timeout=timedelta(seconds=20))
            stored = await client.get(submitted.id)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await asyncio.wait_for(process.wait(), 10)
    assert result == TrainResult(loss=2.0, seen="object", tags=["A", "B"])
    assert json.loads(stored.payload) == {"learning_rate": 0.5, "epochs": 4, "tags": ["a", "b"]}


async def test_a_node_json_submit_reaches_a_python_activity_as_a_dataclass(scheduler: Scheduler) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    worker = Worker(target=scheduler.target, slots=1)
    worker.register("score", score)
    async with worker:
        code, out, err = await run_bounded(
            node,
            str(SCRIPT),
            "submit",
            cwd=SCRIPT.parent,
            env=dict(os.environ, LOWTIDE_TARGET=scheduler.target),
            within=30,
        )
    assert code == 0, err
    finished = json.loads(out.strip().splitlines()[-1])
    assert finished["state"] == task_pb2.TaskState.Name(task_pb2.TASK_STATE_COMPLETED)
    assert finished["result"] == {"name": "node", "total": 13.0, "kind": "ScoreParams/Weight"}


@dataclass
class Epoch:
    epoch: int


def progress(params: Epoch) -> None:
    """Runs on the Node worker (typed_node.js)."""
    raise NotImplementedError


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[str]:
    while line := await asyncio.wait_for(stream.readline(), 20):
        yield line.decode().strip()


async def test_a_node_activity_sees_its_context_heartbeats_details_and_its_cancel(scheduler: Scheduler) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    process = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        "worker",
        env=dict(os.environ, LOWTIDE_TARGET=scheduler.target),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        lines = _lines(process.stdout)
        assert await anext(lines) == "welcome"
        async with Client(scheduler.target) as client:
            submitted = await client.submit(progress, Epoch(epoch=3), start_to_close_timeout=timedelta(minutes=5))
            started = json.loads(await anext(lines))
            logged = await anext(lines)

            async def stored() -> bool:
                return (await client.get(submitted.id)).heartbeat_details == b'{"epoch":3,"of":10}'

            await eventually(stored, within=20)
            shown = await run_lowtide("task", "get", str(submitted.id), "--target", scheduler.target)
            await client.cancel(submitted.id)
            cancelled = json.loads(await anext(lines))
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await asyncio.wait_for(process.wait(), 10)
    assert (started["event"], started["taskId"], started["attempt"]) == ("started", submitted.id, 1)
    deadline = datetime.fromisoformat(started["deadline"])
    assert datetime.now(UTC) < deadline < datetime.now(UTC) + timedelta(minutes=6)
    assert logged == f"task_id={submitted.id} attempt=1 stepping"
    assert shown.returncode == 0, shown.stderr
    assert 'heartbeat_details=\'{"epoch":3,"of":10}\'' in shown.stdout
    assert cancelled == {"event": "cancelled", "taskId": submitted.id, "reason": "cancelled by the scheduler"}
