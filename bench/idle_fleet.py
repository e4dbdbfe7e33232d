"""An idle fleet: `python -m bench.idle_fleet TARGET COUNT PREFIX` opens COUNT worker streams to
the scheduler at TARGET, written from the protos alone (stubs of lowtide.v1.WorkerService): each
sends its Hello (4 slots, type `idle`), then a heartbeat every interval its Welcome names, and is
never given anything to do. Prints `ready` once every stream is welcomed, then runs until killed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import grpc

from lowtide_proto.lowtide.v1 import worker_pb2, worker_pb2_grpc

SLOTS = 4


async def _worker(stub: worker_pb2_grpc.WorkerServiceStub, worker_id: str, welcomed: asyncio.Queue[str]) -> None:
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
                interval = message.welcome.heartbeat_interval.ToTimedelta().total_seconds()
                heartbeats = asyncio.create_task(_beat(outgoing, interval))
                welcomed.put_nowait(worker_id)
    finally:
        if heartbeats is not None:
            heartbeats.cancel()


async def _beat(outgoing: asyncio.Queue[worker_pb2.WorkerMessage], interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        outgoing.put_nowait(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))


async def main(target: str, count: int, prefix: str) -> None:
    # A few channels, as a few worker hosts would have; many streams on each.
    channels = [grpc.aio.insecure_channel(target) for _ in range(4)]
    stubs = [worker_pb2_grpc.WorkerServiceStub(c) for c in channels]
    welcomed: asyncio.Queue[str] = asyncio.Queue()
    workers = [asyncio.create_task(_worker(stubs[i % len(stubs)], f"{prefix}-{i}", welcomed)) for i in range(count)]
    for _ in range(count):
        await welcomed.get()
    print("ready", flush=True)
    await asyncio.gather(*workers)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
