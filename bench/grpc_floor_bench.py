"""What a message costs gRPC itself here: the floor under the drain's 64 x 4 shape.

A bare grpc.aio server with lowtide's WorkerService, whose Connect answers every WorkerMessage
with one empty SchedulerMessage, runs in a process of its own; a client process opens 1, 16 or 64
streams on one channel (as a worker process does) and sends each its messages one at a time, each
after the answer to the last. The server's CPU time (utime + stime of its process) over the run,
per message received and answered, is what grpcio spends on a message beside anything lowtide
does with it: the drain's 64 workers x 4 slots cannot put more than 4 tasks in an assignment or
a report, so at least one message each way per 4 tasks is that much CPU per task on each side.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bench._cpu import cpu_seconds
from lowtide_proto.lowtide.v1 import worker_pb2, worker_pb2_grpc
from tests.helpers import free_port

SHAPES = ((1, 4000), (16, 400), (64, 100))  # streams, messages per stream
WARM_UP = 20
_ROOT = str(Path(__file__).resolve().parent.parent)


class _Echo(worker_pb2_grpc.WorkerServiceServicer):
    async def Connect(  # type: ignore[override]
        self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        async for _ in request_iterator:
            await context.write(worker_pb2.SchedulerMessage())


async def _serve(port: int) -> None:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(_Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def _send(port: int, streams: int, messages: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)

        async def stream() -> None:
            call = stub.Connect()
            for _ in range(messages):
                await call.write(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))
                await call.read()
            await call.done_writing()

        await asyncio.gather(*(stream() for _ in range(streams)))


async def _child(*args: str) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.grpc_floor_bench", *args, stdout=asyncio.subprocess.PIPE, env=env
    )


async def _clients(port: int, streams: int, messages: int) -> None:
    process = await _child("send", str(port), str(streams), str(messages))
    await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the gRPC floor's client exited with {process.returncode}")


async def grpc_floor() -> dict[str, Any]:
    port = free_port()
    server = await _child("serve", str(port))
    assert server.stdout is not None
    try:
        if (await asyncio.wait_for(server.stdout.readline(), 60)).strip() != b"ready":
            raise RuntimeError("the gRPC floor's server did not start")
        runs = []
        for streams, messages in SHAPES:
            await _clients(port, streams, WARM_UP)
            before = cpu_seconds(server.pid)
            await _clients(port, streams, messages)
            spent = cpu_seconds(server.pid) - before
            count = streams * messages
            per_message = round(1e6 * spent / count)
            runs.append({"streams": streams, "messages": count, "server_cpu_us_per_message": per_message})
            print(f"[grpc_floor] {streams} streams: {per_message} µs a message", file=sys.stderr)
    finally:
        server.terminate()
        await server.wait()
    return {
        "runs": runs,
        "method": "server process utime+stime per WorkerMessage received and answered by one SchedulerMessage",
    }


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(_serve(int(sys.argv[2])))
    else:
        asyncio.run(_send(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
