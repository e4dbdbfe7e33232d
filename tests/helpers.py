"""Small helpers the tests share: polling for a condition, ports for services, and worker processes."""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import random
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc

from lowtide_proto.lowtide.v1 import scheduler_pb2

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], *, within: float = 10.0, interval: float = 0.05) -> T:
    """Calls probe until it returns something truthy, or fails after `within` seconds with the last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s (last value: {value!r})")
        await asyncio.sleep(interval)


PORT_BLOCK = 1500


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@functools.cache
def _candidates() -> Iterator[int]:
    """This process's candidate ports, round and round its pytest worker's block."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % 8 if worker.isdigit() else 0
    size = PORT_BLOCK
    # A machine whose ephemeral range starts low (some start it at 1024) has no port outside it:
    # the blocks then start at 16000 and keep workers apart, and the bind check does the rest.
    top = max(_ephemeral_low(), 16_000) - index * size
    block = range(top - size, top)
    start = random.randrange(size)
    return itertools.cycle([*block[start:], *block[:start]])


def bindable(port: int) -> bool:
    """Whether a service could bind 127.0.0.1:port now, binding as the services do (SO_REUSEADDR,
    so connections of earlier tests in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port for a service a test starts by address (one it must know before the service runs).

    Not bind(("127.0.0.1", 0)): that port is in the kernel's ephemeral range, where every outgoing
    connection (a psycopg connection, a gRPC channel, of either pytest worker) takes its local port;
    between the test letting go of it and the service binding it, such a connection can take it and
    the service exits with "address already in use". These come from below that range, from a
    block that is this pytest worker's own, and are checked `bindable`."""
    for port in itertools.islice(_candidates(), PORT_BLOCK):
        if bindable(port):
            return port
    raise AssertionError(f"no free port in this worker's block of {PORT_BLOCK} below the ephemeral range")


def worker_process(target: str, *args: str) -> subprocess.Popen[bytes]:
    """Runs `lowtide demo-worker` as a separate process, as a user would."""
    env = dict(os.environ, LOWTIDE_LOG_LEVEL="WARNING")
    return subprocess.Popen(
        [sys.executable, "-m", "lowtide", "demo-worker", "--target", target, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def scrape_metrics(port: int) -> str:
    """The Prometheus text a service's /metrics on this port serves now (blocking: call it off
    the event loop, with asyncio.to_thread, from a test whose services run on it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


@asynccontextmanager
async def submit_task_only_scheduler(submit_task: Callable[[Any, Any], Awaitable[Any]]) -> AsyncIterator[str]:
    """A gRPC server of SchedulerService.SubmitTask alone (`submit_task(request, context)`), as an
    older scheduler without SubmitStream: its target while the block runs."""
    handler = grpc.unary_unary_rpc_method_handler(
        submit_task,
        request_deserializer=scheduler_pb2.SubmitTaskRequest.FromString,
        response_serializer=scheduler_pb2.SubmitTaskResponse.SerializeToString,
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("lowtide.v1.SchedulerService", {"SubmitTask": handler}),)
    )
    async with on_loopback(server) as target:
        yield target


@asynccontextmanager
async def on_loopback(server: grpc.aio.Server) -> AsyncIterator[str]:
    """The server (its services added) started on a free loopback port: its target while the
    block runs, stopped after."""
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
