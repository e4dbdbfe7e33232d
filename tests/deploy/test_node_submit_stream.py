"""The Node client's submits go over SubmitStream: many at once each get their own task, one the
scheduler refuses fails alone with what SubmitTask gives; against a scheduler without the stream
they go as SubmitTask calls. The process exits once its work is done (the stream does not keep
it alive)."""

from __future__ import annotations

import json
import os
from typing import Any

import grpc
import psycopg
from google.protobuf import duration_pb2

from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from scheduler_service.server import Scheduler
from tests.deploy.node import NODE_DIR, ensure_node_modules, node_or_skip, run_bounded
from tests.helpers import submit_task_only_scheduler

SCRIPT = os.path.join(os.path.dirname(__file__), "submit_node.js")


async def _run(target: str, end: str) -> dict[str, Any]:
    """The script's result; `end`: "close" (it closes its client) or "leave" (it does not, and
    exits only if the client's stream ends once idle)."""
    node = node_or_skip()
    await ensure_node_modules()
    code, out, err = await run_bounded(
        node, SCRIPT, cwd=NODE_DIR, env={**os.environ, "LOWTIDE_TARGET": target}, within=60
    )
    assert code == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


async def test_node_submits_share_a_stream_and_a_refusal_is_that_submit_s_alone(
    scheduler: Scheduler, database_url: str
) -> None:
    bad = task_pb2.TaskSpec(activity_type="echo", start_to_close_timeout=duration_pb2.Duration(seconds=-5))
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        try:
            await scheduler_pb2_grpc.SchedulerServiceStub(channel).SubmitTask(scheduler_pb2.SubmitTaskRequest(task=bad))
            raise AssertionError("SubmitTask took a negative timeout")
        except grpc.aio.AioRpcError as error:
            unary = (error.code().value[0], error.details())
    result = await _run(scheduler.target, "leave")
    assert result["onStream"]
    assert result["bigBack"] == [f"900000:{letter}" for letter in "abcdefgh"]
    assert (result["refused"]["code"], result["refused"]["details"]) == unary
    stored = {int(i): payload for i, payload in result["stored"]}
    assert sorted(stored.values()) == sorted([f"n{i}" for i in range(200)] + ["later"])
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        small = "SELECT id, convert_from(payload, 'UTF8') FROM lowtide.tasks WHERE length(payload) < 100"
        cur = await conn.execute(small)
        assert {int(r[0]): r[1] for r in await cur.fetchall()} == stored, "each submit stored once, the refused one not"


async def test_node_submits_to_a_scheduler_without_the_stream_go_as_submit_task_calls() -> None:
    """An older scheduler answers SubmitStream UNIMPLEMENTED (a gRPC server of SubmitTask alone
    stands in for it): every submit still gets its task, the refused one its error."""
    calls: list[bytes] = []

    async def submit_task(request: scheduler_pb2.SubmitTaskRequest, context: Any) -> scheduler_pb2.SubmitTaskResponse:
        if request.task.start_to_close_timeout.seconds < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start_to_close_timeout: must not be negative")
        calls.append(request.task.payload)
        return scheduler_pb2.SubmitTaskResponse(task=task_pb2.Task(id=len(calls), payload=request.task.payload))

    async with submit_task_only_scheduler(submit_task) as target:
        result = await _run(target, "close")
    refused = (result["refused"]["code"], result["refused"]["details"])
    assert refused == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "start_to_close_timeout: must not be negative")
    assert sorted(payload for _, payload in result["stored"]) == sorted([f"n{i}" for i in range(200)] + ["later"])
    assert len(calls) == 209 and result["bigBack"] == [f"900000:{letter}" for letter in "abcdefgh"]
