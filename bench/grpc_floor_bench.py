"""What a message costs gRPC itself here: the floor under the drain's 64 x 4 shape.

A bare grpc.aio server with lowtide's WorkerService, whose Connect answers every WorkerMessage
with one empty SchedulerMessage, runs in a process of its own; a client process opens 1, 16 or 64
streams on one channel (as a worker process does) and sends each its messages one at a time, each
after the answer to the last. The server's CPU time (utime + stime of its process) over the run,
per message received and answered, is what grpcio spends on a message beside anything lowtide
does with it: the drain's 64 workers x 4 slots cannot put more than 4 tasks in an assignment or
a report, so at least one message each way per 4 tasks is that much CPU per task on each side.

The same server also answers SchedulerService.SubmitTask with an empty response and nothing else
done; a client process fires single calls open loop on one channel at UNARY_RATES (as the
steady bench's load generator does), and the server's CPU per call is what grpcio spends on a
single submit of the steady bench before lowtide does anything with it.
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
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2, worker_pb2, worker_pb2_grpc
from tests.helpers import free_port

SHAPES = ((1, 4000), (16, 400), (64, 100))  # streams, messages per stream
WARM_UP = 20
UNARY_RATES = (100, 300, 1000)  # calls a second, for UNARY_SECONDS each
UNARY_SECONDS = 10
_ROOT = str(Path(__file__).resolve().parent.parent)


class _Echo(worker_pb2_grpc.WorkerServiceServicer):
    async def Connect(  # type: ignore[override]
        self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        async for _ in request_iterator:
            await context.write(worker_pb2.SchedulerMessage())


async def _submitted(
    request: scheduler_pb2.SubmitTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
) -> scheduler_pb2.SubmitTaskResponse:
    return scheduler_pb2.SubmitTaskResponse()


async def _serve(port: int) -> None:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(_Echo(), server)
    submit = grpc.unary_unary_rpc_method_handler(
        _submitted,
        request_deserializer=scheduler_pb2.SubmitTaskRequest.FromString,
        response_serializer=scheduler_pb2.SubmitTaskResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("lowtide.v1.SchedulerService", {"SubmitTask": submit}),)
    )
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


async def _submit(port: int, rate: int, calls: int) -> None:
    """`calls` SubmitTask calls fired open loop, `rate` a second, on one channel."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        request = scheduler_pb2.SubmitTaskRequest(task=task_pb2.TaskSpec(activity_type="echo"))
        loop = asyncio.get_running_loop()
        start, fired = loop.time(), []
        for n in range(calls):
            await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
            fired.append(asyncio.ensure_future(stub.SubmitTask(request)))
        await asyncio.gather(*fired)


async def _child(*args: str) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.grpc_floor_bench", *args, stdout=asyncio.subprocess.PIPE, env=env
    )


async def _clients(port: int, streams: int, messages: int, mode: str = "send") -> None:
    process = await _child(mode, str(port), str(streams), str(messages))
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
        unary = []
        for rate in UNARY_RATES:
            await _clients(port, rate, WARM_UP, "submit")
            before = cpu_seconds(server.pid)
            await _clients(port, rate, rate * UNARY_SECONDS, "submit")
            per_call = round(1e6 * (cpu_seconds(server.pid) - before) / (rate * UNARY_SECONDS))
            unary.append({"calls_per_s": rate, "server_cpu_us_per_call": per_call})
            print(f"[grpc_floor] SubmitTask at {rate}/s: {per_call} µs a call", file=sys.stderr)
    finally:
        server.terminate()
        await server.wait()
    return {
        "runs": runs,
        "unary": unary,
        "method": "server process utime+stime per WorkerMessage received and answered by one SchedulerMessage; "
        "per SubmitTask call answered with an empty response, calls fired open loop on one channel",
    }


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(_serve(int(sys.argv[2])))
    elif sys.argv[1] == "submit":
        asyncio.run(_submit(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    else:
        asyncio.run(_send(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
