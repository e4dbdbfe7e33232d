"""One process of subscribers for the fan-out benchmark: opens COUNT Subscribe streams, says
`ready` once each has its first state, records when each later version arrives, and on end of
stdin prints {version: last arrival (epoch seconds)} as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc

from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc


async def main(target: str, count: int) -> None:
    last: dict[int, float] = {}
    first = asyncio.Semaphore(0)
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(8)]

    async def subscriber(index: int) -> None:
        stub = signal_pb2_grpc.SignalServiceStub(channels[index % len(channels)])
        call = stub.Subscribe(signal_pb2.SubscribeRequest())
        seen_first = False
        async for response in call:
            now = time.time()
            version = response.state.version
            last[version] = max(last.get(version, 0.0), now)
            if not seen_first:
                seen_first = True
                first.release()

    tasks = [asyncio.create_task(subscriber(i)) for i in range(count)]
    for _ in range(count):
        await first.acquire()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for task in tasks:
        task.cancel()
    print(json.dumps(last), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
