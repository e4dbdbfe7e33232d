"""`lowtide health`: the gRPC health check (grpc.health.v1) of a running service, as a probe.

Container health checks and Kubernetes exec probes need a command that exits 0 when the service
serves and non-zero otherwise; `grpc_health_probe` would be one more binary in the image, and
every lowtide image already has this command.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide_proto.channel import Security, open_channel


@dataclass(frozen=True)
class HealthAnswer:
    serving: bool
    message: str


async def check_health(
    target: str, service: str = "", *, within: float = 3.0, security: Security | None = None
) -> HealthAnswer:
    """Asks `target` whether `service` ("" for the whole server) is SERVING; never raises for an
    unreachable or unhealthy server: the answer says what was wrong. `security` reaches a TLS
    service (the health service itself needs no token)."""
    what = f"{service or 'server'} at {target}"
    async with open_channel(target, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=within)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return HealthAnswer(False, f"{what}: unknown service (the server does not report on {service!r})")
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                return HealthAnswer(False, f"{what}: the server has no grpc.health.v1 health service")
            return HealthAnswer(False, f"{what}: {error.code().name}: {error.details()}")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return HealthAnswer(response.status == health_pb2.HealthCheckResponse.SERVING, f"{what}: {status}")


async def check_http(url: str, *, within: float = 3.0) -> HealthAnswer:
    """The web console's health check (it serves HTTP, not gRPC): does `url` answer 200?"""
    try:
        async with httpx.AsyncClient(timeout=within) as client:
            response = await client.get(url)
    except httpx.HTTPError as error:
        return HealthAnswer(False, f"{url}: {error or type(error).__name__}")
    return HealthAnswer(response.status_code == 200, f"{url}: HTTP {response.status_code}")


async def wait_http(url: str) -> None:
    """Returns once `url` answers 200 over HTTP (the web console's readiness; it has no gRPC)."""
    async with httpx.AsyncClient(timeout=1.0) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
