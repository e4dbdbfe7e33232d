"""With tracing on, the RPC-span interceptor runs before auth: a call without a valid token is still
refused (UNAUTHENTICATED, PERMISSION_DENIED for the wrong role) and nothing of it reaches a handler,
its span records the refusal, and an allowed call goes through. The spans go to a local OTLP receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from lowtide_client import task_spec
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually
from tests.otlp import OtlpReceiver
from tests.security.conftest import TOKENS, secured

SUBMIT = "/lowtide.v1.SchedulerService/SubmitTask"


@pytest.fixture
async def traced_guarded(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Scheduler, OtlpReceiver]]:
    async with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        running = await start_scheduler(secured(make_config()), database_url=database_url)
        try:
            yield running, receiver
        finally:
            await running.stop(grace=0.5)


async def _submit(stub: scheduler_pb2_grpc.SchedulerServiceStub, token: str | None) -> grpc.StatusCode:
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    try:
        await stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(task=task_spec("echo")), metadata=metadata)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_auth_still_refuses_with_tracing_on_and_the_refusals_are_traced(
    traced_guarded: tuple[Scheduler, OtlpReceiver],
) -> None:
    scheduler, receiver = traced_guarded
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        codes = [await _submit(stub, token) for token in (None, "not-a-token", TOKENS["worker"], TOKENS["submitter"])]
    assert codes == [
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.OK,
    ]
    tasks = await scheduler.store.list_tasks(queue=None, state=None, activity_type=None, before_id=None, limit=10)
    assert len(tasks) == 1, "only the allowed call reached the handler"

    async def four() -> list[int]:
        spans = receiver.named(SUBMIT)
        return [s.attribute("rpc.grpc.status_code") for s in spans] if len(spans) == 4 else []

    statuses = await eventually(four, within=20)
    assert sorted(statuses) == sorted(
        [
            grpc.StatusCode.UNAUTHENTICATED.value[0],
            grpc.StatusCode.UNAUTHENTICATED.value[0],
            grpc.StatusCode.PERMISSION_DENIED.value[0],
            grpc.StatusCode.OK.value[0],
        ]
    )
