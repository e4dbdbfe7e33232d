"""KEDA's external scaler over gRPC, as KEDA calls it: a pool's desired workers from its
claimable backlog, its running attempts and its reservations ahead, held work left out while the
cost signal is high."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from lowtide_client import Client, SignalClient, Worker
from lowtide_proto.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from scheduler_service.api.keda import SERVICE_NAME, KedaScaler, ScaleTarget, add_keda_scaler
from scheduler_service.domain.pacing import READ_SHARE
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer
from tests.cost.conftest import cost_config
from tests.deploy.compose import REPO
from tests.helpers import eventually

# What each look of the stream test below is made to take more than the database needs.
SLOWER = 0.03


@dataclass
class Scaling:
    scheduler: Scheduler
    signal: SignalServer
    stub: externalscaler_pb2_grpc.ExternalScalerStub
    reserved: dict[str, int]


@pytest.fixture
async def scaling(signal_service: SignalServer, database_url: str) -> AsyncIterator[Scaling]:
    # `train` is cost-deferrable (cost_config); the signal starts unknown, so high.
    scheduler = await start_scheduler(cost_config(signal_service.target), database_url=database_url)
    reserved: dict[str, int] = {}

    async def reserved_ahead(pool: str) -> int:
        return reserved.get(pool, 0)

    # Served on its own port here; in the scheduler it shares the scheduler's server.
    server = grpc.aio.server()
    add_keda_scaler(
        server,
        store=scheduler.store,
        registry=scheduler.registry,
        holds=scheduler.dispatcher.holds,
        reserved=reserved_ahead,
        stream_interval=0.05,
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Scaling(scheduler, signal_service, externalscaler_pb2_grpc.ExternalScalerStub(channel), reserved)
    finally:
        await channel.close()
        await server.stop(0)
        await scheduler.stop(grace=0.5)


def ref(**metadata: str) -> externalscaler_pb2.ScaledObjectRef:
    return externalscaler_pb2.ScaledObjectRef(name="workers", namespace="jobs", scalerMetadata=metadata)


async def metric(scaling: Scaling, **metadata: str) -> int:
    response = await scaling.stub.GetMetrics(
        externalscaler_pb2.GetMetricsRequest(scaledObjectRef=ref(**metadata), metricName="s0-lowtide")
    )
    [value] = response.metricValues
    assert value.metricName == "s0-lowtide"
    assert value.metricValueFloat == value.metricValue
    return int(value.metricValue)


async def test_metric_spec_asks_one_replica_per_desired_worker(scaling: Scaling) -> None:
    response = await scaling.stub.GetMetricSpec(ref(pool="gpu"))
    [spec] = response.metricSpecs
    assert spec.metricName == "lowtide-gpu-desired-workers"
    assert (spec.targetSize, spec.targetSizeFloat) == (1, 1.0)
    assert SERVICE_NAME == "externalscaler.ExternalScaler"


async def test_idle_pool_is_inactive_and_wants_no_workers(scaling: Scaling) -> None:
    assert not (await scaling.stub.IsActive(ref(pool="default"))).result
    assert await metric(scaling, pool="default") == 0
    assert await metric(scaling, pool="default", minWorkers="2") == 2
    assert not (await scaling.stub.IsActive(ref(pool="default", minWorkers="2"))).result


async def test_backlog_counts_held_work_only_once_the_signal_falls(scaling: Scaling) -> None:
    async with Client(scaling.scheduler.target) as client:
        for _ in range(10):
            await client.submit("echo", b"")
        for _ in range(6):
            await client.submit("train", b"")
    # Signal unknown, so high: the 6 `train` tasks are held and do not ask for workers.
    assert await metric(scaling, pool="default", slotsPerWorker="4") == 3
    assert (await scaling.stub.IsActive(ref(pool="default", slotsPerWorker="4"))).result
    async with SignalClient(scaling.signal.target) as signal:
        await signal.set(100.0)

    async def released() -> bool:
        return await metric(scaling, pool="default", slotsPerWorker="4") == 4

    await eventually(released)
    assert await metric(scaling, pool="default", slotsPerWorker="4", maxWorkers="2") == 2
    # Another pool's queues have none of it.
    assert await metric(scaling, pool="other", queues="batch") == 0


async def test_running_attempts_and_reservations_ahead_count(scaling: Scaling) -> None:
    release = asyncio.Event()
    worker = Worker(target=scaling.scheduler.target, pool="render", queues=["frames"], slots=3)

    @worker.activity("render")
    async def render(payload: bytes) -> bytes:
        await release.wait()
        return payload

    async with worker, Client(scaling.scheduler.target) as client:
        for _ in range(5):
            await client.submit("render", b"", queue="frames")

        # 3 running on the worker, 2 waiting: ceil(5 / 3) workers of the pool's 3 slots each.
        async def busy() -> bool:
            return await metric(scaling, pool="render") == 2

        await eventually(busy)
        scaling.reserved["render"] = 2
        assert await metric(scaling, pool="render") == 3
        release.set()


async def test_stream_is_active_sends_the_state_then_each_change(scaling: Scaling) -> None:
    stream = scaling.stub.StreamIsActive(ref(pool="reports", queues="nightly"))
    try:
        first = await asyncio.wait_for(stream.read(), 5)
        assert first.result is False
        async with Client(scaling.scheduler.target) as client:
            await client.submit("summarise", b"", queue="nightly")
        changed = await asyncio.wait_for(stream.read(), 5)
        assert changed.result is True
    finally:
        stream.cancel()


async def test_a_costly_look_is_repeated_less_often_on_the_stream(
    scaling: Scaling, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each look counts the pool's backlog, half a second with a million pending: the stream looks
    again after its interval (50 ms here), or after 20 times what the look took when that is
    longer (domain.pacing). Each look here is made to take 30 ms more than the database needs."""
    loop = asyncio.get_running_loop()
    looks: list[float] = []
    real = KedaScaler._active

    async def slow_active(self: KedaScaler, target: ScaleTarget) -> bool:
        looks.append(loop.time())
        await asyncio.sleep(SLOWER)
        return await real(self, target)

    monkeypatch.setattr(KedaScaler, "_active", slow_active)
    stream = scaling.stub.StreamIsActive(ref(pool="reports", queues="nightly"))
    try:
        await asyncio.wait_for(stream.read(), 5)

        async def looked_four_times() -> bool:
            return len(looks) >= 4

        await eventually(looked_four_times, within=30)
    finally:
        stream.cancel()
    gaps = [later - earlier for earlier, later in itertools.pairwise(looks)]
    assert min(gaps) >= SLOWER / READ_SHARE, gaps


async def test_a_scaled_object_without_a_pool_is_refused_with_the_reason(scaling: Scaling) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaling.stub.GetMetrics(externalscaler_pb2.GetMetricsRequest(scaledObjectRef=ref()))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "scalerMetadata.pool: is required" in str(raised.value.details())
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaling.stub.IsActive(ref(pool="default", slotsPerWorker="many"))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stream = scaling.stub.StreamIsActive(ref())
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stream.read()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_scheduler_serves_the_scaler_on_its_own_port(scheduler: Scheduler) -> None:
    # KEDA's scalerAddress is the scheduler's gRPC port; server.py registers the scaler there.
    if "add_keda_scaler(" not in (REPO / "scheduler_service" / "server.py").read_text():
        pytest.skip("scheduler_service/server.py does not register the KEDA scaler yet")
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = externalscaler_pb2_grpc.ExternalScalerStub(channel)
        response = await stub.GetMetricSpec(ref(pool="default"))
    assert [s.metricName for s in response.metricSpecs] == ["lowtide-default-desired-workers"]
