"""An idle fleet: `python -m bench.idle_fleet TARGET COUNT PREFIX` opens COUNT worker streams to
the scheduler at TARGET, written from the protos alone (stubs of lowtide.v1.WorkerService): each
sends its Hello (4 slots, type `idle`), then, as it runs nothing, a heartbeat every idle interval
its Welcome names (its busy interval from a scheduler that names none), and is never given
anything to do. The first heartbeat of each comes at a random point of its first interval, as in
a fleet that connected over time. Prints `ready SECONDS` (the interval the streams beat at) once
every stream is welcomed, then runs until killed.
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import AsyncIterator

import grpc

from lowtide_proto.lowtide.v1 import worker_pb2, worker_pb2_grpc

SLOTS = 4


async def _worker(stub: worker_pb2_grpc.WorkerServiceStub, worker_id: str, welcomed: asyncio.Queue[float]) -> None:
    outgoing: asyncio.Queue[worker_pb2.WorkerMessage] = asyncio.Queue()
    hello = worker_pb2.Hello(worker_id=worker_id, slots=SLOTS, activity_types=[worker_pb2.ActivityType(name="idle")])
    outgoing.put_nowait(worker_pb2.WorkerMessage(hello=hello))

    async def messages() -> AsyncIterator[worker_pb2.WorkerMessage]:
        while True:
            yield await outgoing.get()

    call = stub.Connect(messages())
    heartbeats: asyncio.Task[None] | None = None
    try:
        async for message in call:
            if message.WhichOneof("message") == "welcome":
                welcome = message.welcome
                idle = welcome.HasField("idle_heartbeat_interval")
                interval = (welcome.idle_heartbeat_interval if idle else welcome.heartbeat_interval).ToTimedelta()
                heartbeats = asyncio.create_task(_beat(outgoing, interval.total_seconds()))
                welcomed.put_nowait(interval.total_seconds())
    finally:
        if heartbeats is not None:
            heartbeats.cancel()


async def _beat(outgoing: asyncio.Queue[worker_pb2.WorkerMessage], interval: float) -> None:
    await asyncio.sleep(random.uniform(0, interval))
    while True:
        outgoing.put_nowait(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))
        await asyncio.sleep(interval)


async def main(target: str, count: int, prefix: str) -> None:
    # A few channels, as a few worker hosts would have; many streams on each.
    channels = [grpc.aio.insecure_channel(target) for _ in range(4)]
    stubs = [worker_pb2_grpc.WorkerServiceStub(c) for c in channels]
    welcomed: asyncio.Queue[float] = asyncio.Queue()
    workers = [asyncio.create_task(_worker(stubs[i % len(stubs)], f"{prefix}-{i}", welcomed)) for i in range(count)]
    intervals = {await welcomed.get() for _ in range(count)}
    print(f"ready {max(intervals)}", flush=True)
    await asyncio.gather(*workers)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
