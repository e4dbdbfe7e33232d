"""One trace per task, exported over OTLP: the services run with OTEL_TRACES_EXPORTER=otlp pointed at
a local OTLP receiver (where the collector would be), and a real worker process (lowtide_client, with
the OpenTelemetry SDK) exports to the same place. Each task's trace holds its submission, its wait on a
hold (with the reason), its dispatch, the worker's run and the result, each a child of the submission;
every RPC of both services, unary or streaming, gets a span."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from lowtide.config import Config, SignalConfig
from lowtide_client import Client, SignalClient, task_spec
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from scheduler_service.observe.task_metrics import DISPATCH_LATENCY, QUEUE_WAIT, RUN
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import NO_AUTH
from tests.cost.conftest import cost_config
from tests.helpers import eventually
from tests.otlp import OtlpReceiver, Received, attributes

REPO = Path(__file__).resolve().parents[2]
# The scheduler's span of a submit: a SubmitStream message (Client.submit), a SubmitTask call.
SUBMIT = "/lowtide.v1.SchedulerService/SubmitStream"
UNARY_SUBMIT = "/lowtide.v1.SchedulerService/SubmitTask"
# A submitter's own trace context (W3C), as a client library would send it.
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
COMPLETED = task_pb2.TaskState.Value("TASK_STATE_COMPLETED")
FAILED = task_pb2.TaskState.Value("TASK_STATE_FAILED")
PENDING = task_pb2.TaskState.Value("TASK_STATE_PENDING")


@dataclass
class Traced:
    receiver: OtlpReceiver
    signal: SignalServer
    scheduler: Scheduler
    worker: subprocess.Popen[bytes]

    async def set_signal(self, value: float) -> None:
        async with SignalClient(self.signal.target) as client:
            await client.set(value=value)

    async def stop_worker(self) -> None:
        """SIGTERM, and wait without blocking the loop (the receiver on it takes the worker's last spans)."""
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            await asyncio.to_thread(self.worker.wait, 20)


def _traced_worker(target: str, log: Path) -> subprocess.Popen[bytes]:
    """`python -m tests.process.traced_worker`, exporting to where the services do."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.process.traced_worker", "--target", target],
            cwd=REPO,
            env=dict(os.environ, OTEL_SERVICE_NAME="test-worker"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture
async def traced(database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[Traced]:
    async with OtlpReceiver() as receiver:
        otel = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            # Export each batch soon: the test waits for spans, not for the default 5 s.
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        for name, value in otel.items():
            monkeypatch.setenv(name, value)
        signal_service = await start_signal_service(
            Config(signal=SignalConfig(listen="127.0.0.1:0", metrics_listen=""), auth=NO_AUTH),
            database_url=database_url,
        )
        scheduler = await start_scheduler(cost_config(signal_service.target), database_url=database_url)
        worker = _traced_worker(scheduler.target, tmp_path / "worker.log")
        running = Traced(receiver, signal_service, scheduler, worker)
        try:
            yield running
        finally:
            await running.stop_worker()
            await scheduler.stop(grace=0.5)
            await signal_service.stop(grace=0.5)


def _trace_of(receiver: OtlpReceiver, task_id: int) -> dict[str, Received]:
    """The spans of the task's trace by name (its dispatch span names the task)."""
    dispatch = [s for s in receiver.named("task.dispatch") if s.attribute("lowtide.task.id") == task_id]
    if not dispatch:
        return {}
    spans: dict[str, Received] = {}
    for span in receiver.in_trace(dispatch[0].trace_id):
        if span.attribute("lowtide.task.id") in (task_id, None):
            spans.setdefault(span.name, span)
    return spans


async def _whole_trace(receiver: OtlpReceiver, task_id: int, names: set[str]) -> dict[str, Received]:
    async def complete() -> dict[str, Received]:
        spans = _trace_of(receiver, task_id)
        return spans if names <= spans.keys() else {}

    try:
        return await eventually(complete, within=20)
    except AssertionError:
        seen = sorted({(s.service, s.name) for s in receiver.spans})
        raise AssertionError(
            f"task {task_id}: {names - _trace_of(receiver, task_id).keys()} missing; seen {seen}"
        ) from None


async def test_each_task_has_one_trace_from_submission_through_the_worker_to_its_result(traced: Traced) -> None:
    await traced.set_signal(100)
    async with Client(traced.scheduler.target) as client:
        tasks = [await client.submit("echo", str(n)) for n in range(3)]
        failing = await client.submit("boom", "x", max_attempts=1)
        for task in [*tasks, failing]:
            assert (await client.wait(task.id)).state in (COMPLETED, FAILED)
    names = {SUBMIT, "task.dispatch", "task.run", "task.result"}
    traces = [await _whole_trace(traced.receiver, task.id, names) for task in [*tasks, failing]]
    assert len({spans[SUBMIT].trace_id for spans in traces}) == 4, "one trace per task"
    for task, spans in zip([*tasks, failing], traces, strict=True):
        submit = spans[SUBMIT]
        assert submit.service == "lowtide-scheduler"
        assert submit.parent_id == "", "the submission is the root when the submitter sent no context"
        for name in ("task.dispatch", "task.run", "task.result"):
            assert spans[name].parent_id == submit.span_id, name
        assert "task.held" not in spans
        assert spans["task.run"].service == "test-worker"
        dispatch = spans["task.dispatch"]
        assert dispatch.attribute("lowtide.queue") == "default"
        assert dispatch.attribute("lowtide.activity_type") == task.activity_type
        assert dispatch.attribute("lowtide.task.attempt") == 1
        assert dispatch.attribute("lowtide.worker.id")
        assert submit.span.start_time_unix_nano <= dispatch.span.start_time_unix_nano
        assert dispatch.span.end_time_unix_nano <= spans["task.result"].span.start_time_unix_nano
    completed, failed = traces[0]["task.result"], traces[3]["task.result"]
    assert completed.attribute("lowtide.task.status") == "completed"
    assert failed.attribute("lowtide.task.status") == "failed"
    assert failed.attribute("error.type") == "ValueError"
    assert traces[3]["task.run"].attribute("error.type") == "ValueError"
    # The same tasks' histogram points reach the same receiver over OTLP, labelled and bucketed.
    await eventually(lambda: _histograms_of(traced.receiver, {"echo", "boom"}), within=20)


async def _histograms_of(receiver: OtlpReceiver, types: set[str]) -> bool:
    """Whether run time, queue wait and dispatch latency have points for each of the types, the
    run-time points counting each finished attempt (the services export cumulative sums)."""
    for name in (RUN, QUEUE_WAIT, DISPATCH_LATENCY):
        points = receiver.histograms.get(name, [])
        seen = {
            attributes(p).get("activity_type") for p in points if p.count and attributes(p).get("queue") == "default"
        }
        if not types <= seen or any(len(p.explicit_bounds) < 10 for p in points):
            return False
    runs = {attributes(p).get("activity_type"): p.count for p in receiver.histograms[RUN]}
    return runs.get("echo", 0) >= 3 and runs.get("boom", 0) >= 1


async def test_a_held_task_trace_says_how_long_it_was_held_and_why(traced: Traced) -> None:
    await traced.set_signal(520)
    async with Client(traced.scheduler.target) as client:
        held = await client.submit("train", "model")
        await eventually(lambda: _worker_connected(traced))
        assert (await client.get(held.id)).state == PENDING, "held while the signal is high"
        await traced.set_signal(100)
        assert (await client.wait(held.id)).state == COMPLETED
    spans = await _whole_trace(traced.receiver, held.id, {SUBMIT, "task.held", "task.dispatch", "task.result"})
    hold = spans["task.held"]
    assert hold.parent_id == spans[SUBMIT].span_id
    assert hold.attribute("lowtide.hold.reason") == "cost_hold"
    seconds = hold.attribute("lowtide.hold.seconds")
    assert seconds > 0
    assert hold.span.end_time_unix_nano - hold.span.start_time_unix_nano == pytest.approx(seconds * 1e9, abs=1e6)
    assert hold.span.start_time_unix_nano >= spans[SUBMIT].span.start_time_unix_nano
    assert hold.span.end_time_unix_nano <= spans["task.dispatch"].span.end_time_unix_nano


async def _worker_connected(traced: Traced) -> bool:
    return any(True for _ in traced.scheduler.registry)


async def test_a_submitter_trace_context_is_the_parent_of_the_task_spans(traced: Traced) -> None:
    await traced.set_signal(100)
    async with Client(traced.scheduler.target) as client:
        in_headers = await client.submit("echo", "h", headers={"traceparent": CLIENT_TRACEPARENT})
        assert (await client.wait(in_headers.id)).state == COMPLETED
    async with grpc.aio.insecure_channel(traced.scheduler.target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        request = scheduler_pb2.SubmitTaskRequest(task=task_spec("echo", "m"))
        metadata = (("traceparent", f"00-{'1' * 32}-{'2' * 16}-01"),)
        in_metadata = (await stub.SubmitTask(request, metadata=metadata)).task
    headers = await _whole_trace(traced.receiver, in_headers.id, {"task.dispatch", "task.run", "task.result"})
    for name in ("task.dispatch", "task.run", "task.result"):
        assert (headers[name].trace_id, headers[name].parent_id) == (CLIENT_TRACE, CLIENT_SPAN), name
    assert dict(in_headers.headers) == {"traceparent": CLIENT_TRACEPARENT}, "the submitter's context is kept"
    spans = await _whole_trace(
        traced.receiver, in_metadata.id, {UNARY_SUBMIT, "task.dispatch", "task.run", "task.result"}
    )
    assert (spans[UNARY_SUBMIT].trace_id, spans[UNARY_SUBMIT].parent_id) == ("1" * 32, "2" * 16)
    assert spans["task.run"].parent_id == spans[UNARY_SUBMIT].span_id
    assert dict(in_metadata.headers)["traceparent"] == f"00-{'1' * 32}-{spans[UNARY_SUBMIT].span_id}-01"


async def test_the_client_s_current_span_is_the_parent_of_its_submit_over_the_stream(traced: Traced) -> None:
    """Client.submit sends the caller's trace context with each submit of its SubmitStream (as an
    instrumented unary call sends it in metadata): two submits made together, under two spans,
    are in two traces, even when one message carries both."""
    await traced.set_signal(100)
    parents = [(f"{n:032x}", f"{n:016x}") for n in (3, 4)]
    async with Client(traced.scheduler.target) as client:

        async def submit_under(trace_id: str, span_id: str) -> Any:
            caller = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(1))
            token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(caller)))
            try:
                return await client.submit("echo", "s")
            finally:
                otel_context.detach(token)

        submitted = await asyncio.gather(*(submit_under(*parent) for parent in parents))
        for task in submitted:
            assert (await client.wait(task.id)).state == COMPLETED
    for task, parent in zip(submitted, parents, strict=True):
        spans = await _whole_trace(traced.receiver, task.id, {SUBMIT, "task.dispatch", "task.run", "task.result"})
        assert (spans[SUBMIT].trace_id, spans[SUBMIT].parent_id) == parent
        assert spans[SUBMIT].service == "lowtide-scheduler"
        assert spans["task.run"].parent_id == spans[SUBMIT].span_id


async def test_every_rpc_of_both_services_gets_a_span_unary_and_streaming(traced: Traced) -> None:
    await traced.set_signal(100)
    for target in (traced.scheduler.target, traced.signal.target):
        async with grpc.aio.insecure_channel(target) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            # Watch writes with context.write (as WorkerService/Connect does): a stream too.
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            answers = [r async for r in reflect]
            assert answers[0].list_services_response.service
    async with SignalClient(traced.signal.target) as client:
        async for update in client.updates():
            assert update.state.value == 100
            break
    await eventually(lambda: _worker_connected(traced))
    await traced.stop_worker()  # its WorkerService/Connect stream ends
    expected = {
        ("lowtide-scheduler", "/grpc.health.v1.Health/Check"),
        ("lowtide-signal", "/grpc.health.v1.Health/Check"),
        ("lowtide-scheduler", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
        ("lowtide-signal", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
        ("lowtide-signal", "/lowtide.v1.SignalService/SetSignal"),
        ("lowtide-signal", "/lowtide.v1.SignalService/Subscribe"),
        ("lowtide-scheduler", "/lowtide.v1.WorkerService/Connect"),
    }
    watched = {(service, "/grpc.health.v1.Health/Watch") for service in ("lowtide-scheduler", "lowtide-signal")}

    async def exported() -> set[tuple[str, str]]:
        return (expected | watched) - {(s.service, s.name) for s in traced.receiver.spans}

    async def none_missing() -> bool:
        return not await exported()

    try:
        await eventually(none_missing, within=20)
    except AssertionError:
        raise AssertionError(f"no span for {sorted(await exported())}") from None
    failed = [s for s in traced.receiver.spans if s.span.status.code == s.span.status.STATUS_CODE_ERROR]
    assert [(s.service, s.name) for s in failed if (s.service, s.name) in expected] == []
