"""KEDA's external scaler (protos/externalscaler/externalscaler.proto) on the scheduler, so
Kubernetes scales a pool's worker Deployment on the pool's desired workers.

Why it works this way: docs/architecture/observe.md.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc

from lowtide.errors import InvalidArgument
from lowtide.grpc_status import abort, handles_errors
from lowtide_proto.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from scheduler_service.domain.capacity import desired_workers
from scheduler_service.domain.pacing import paced
from scheduler_service.fleet.sessions import Registry
from scheduler_service.holds.signals import SignalHolds
from scheduler_service.observe.status import held
from scheduler_service.store import Store

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
# Reservations inside the autoscale horizon, per pool: the fixed starts' share of the capacity.
Reserved: TypeAlias = Callable[[str], Awaitable[int]]

SERVICE_NAME = externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"].full_name


@dataclass(frozen=True)
class ScaleTarget:
    """What a ScaledObject's scalerMetadata asks about."""

    pool: str
    queues: tuple[str, ...] | None
    slots_per_worker: int | None
    min_workers: int
    max_workers: int | None

    @property
    def metric_name(self) -> str:
        return f"lowtide-{self.pool}-desired-workers"


def _count(metadata: Mapping[str, str], key: str) -> int | None:
    text = metadata.get(key, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"scalerMetadata.{key}", f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise InvalidArgument(f"scalerMetadata.{key}", "must not be negative")
    return value


def scale_target(ref: externalscaler_pb2.ScaledObjectRef) -> ScaleTarget:
    metadata = dict(ref.scalerMetadata)
    pool = metadata.get("pool", "").strip()
    if not pool:
        raise InvalidArgument("scalerMetadata.pool", "is required: the lowtide pool whose workers this object scales")
    queues = tuple(q.strip() for q in metadata.get("queues", "").split(",") if q.strip()) or None
    slots = _count(metadata, "slotsPerWorker")
    if slots == 0:
        raise InvalidArgument("scalerMetadata.slotsPerWorker", "must be at least 1")
    return ScaleTarget(pool, queues, slots, _count(metadata, "minWorkers") or 0, _count(metadata, "maxWorkers"))


class KedaScaler(externalscaler_pb2_grpc.ExternalScalerServicer):
    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        holds: SignalHolds,
        reserved: Reserved,
        stream_interval: float = 1.0,
    ) -> None:
        self._store = store
        self._registry = registry
        self._holds = holds
        self._reserved = reserved
        self._stream_interval = stream_interval

    async def desired(self, target: ScaleTarget) -> int:
        """The pool's desired workers now: claimable backlog of its queues (held work excluded),
        what its workers run, and its reservations ahead, over the slots of one worker."""
        sessions = [s for s in self._registry if s.pool == target.pool]
        queues = set(target.queues or {q for s in sessions for q in s.queues} or {"default"})
        claimable = 0
        for group in await self._store.pending_by_queue_and_type():
            if group.queue in queues and not held(self._holds, group):
                claimable += group.depth
        pool = next((p for p in await self._store.pools() if p.pool == target.pool), None)
        running = pool.busy if pool else 0
        slots = target.slots_per_worker
        if slots is None:
            slots = math.ceil(pool.slots / pool.workers) if pool and pool.workers else 1
        return desired_workers(
            claimable=claimable,
            running=running,
            slots_per_worker=slots,
            reserved=await self._reserved(target.pool),
            min_workers=target.min_workers,
            max_workers=target.max_workers,
        )

    async def _active(self, target: ScaleTarget) -> bool:
        # Active means "there is work for this pool": minWorkers alone keeps nobody at work, so
        # KEDA may still scale to zero (its own minReplicaCount decides the floor).
        floorless = ScaleTarget(target.pool, target.queues, target.slots_per_worker, 0, target.max_workers)
        return await self.desired(floorless) > 0

    @handles_errors
    async def IsActive(
        self, request: externalscaler_pb2.ScaledObjectRef, context: Context
    ) -> externalscaler_pb2.IsActiveResponse:
        return externalscaler_pb2.IsActiveResponse(result=await self._active(scale_target(request)))

    async def StreamIsActive(
        self, request: externalscaler_pb2.ScaledObjectRef, context: Context
    ) -> AsyncIterator[externalscaler_pb2.IsActiveResponse]:
        """The current answer at once, then each change (looked at every stream_interval)."""
        try:
            target = scale_target(request)
        except InvalidArgument as error:
            await abort(context, error)
        last: bool | None = None
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            active = await self._active(target)
            if active != last:
                last = active
                yield externalscaler_pb2.IsActiveResponse(result=active)
            # Looked at less often while the look is costly (a backlog of millions): domain.pacing.
            await asyncio.sleep(paced(self._stream_interval, loop.time() - began))

    @handles_errors
    async def GetMetricSpec(
        self, request: externalscaler_pb2.ScaledObjectRef, context: Context
    ) -> externalscaler_pb2.GetMetricSpecResponse:
        target = scale_target(request)
        spec = externalscaler_pb2.MetricSpec(metricName=target.metric_name, targetSize=1, targetSizeFloat=1.0)
        return externalscaler_pb2.GetMetricSpecResponse(metricSpecs=[spec])

    @handles_errors
    async def GetMetrics(
        self, request: externalscaler_pb2.GetMetricsRequest, context: Context
    ) -> externalscaler_pb2.GetMetricsResponse:
        target = scale_target(request.scaledObjectRef)
        desired = await self.desired(target)
        # KEDA may ask under its own prefixed name ("s0-..."); answer under the name it asked for.
        value = externalscaler_pb2.MetricValue(
            metricName=request.metricName or target.metric_name, metricValue=desired, metricValueFloat=float(desired)
        )
        return externalscaler_pb2.GetMetricsResponse(metricValues=[value])


def add_keda_scaler(
    server: grpc.aio.Server,
    *,
    store: Store,
    registry: Registry,
    holds: SignalHolds,
    reserved: Reserved,
    stream_interval: float = 1.0,
) -> KedaScaler:
    """Serves KEDA's ExternalScaler on `server` (call before server.start()); returns the servicer."""
    scaler = KedaScaler(store=store, registry=registry, holds=holds, reserved=reserved, stream_interval=stream_interval)
    externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(scaler, server)
    return scaler
