"""TLS on both services, and mutual TLS: a client that trusts the CA gets through, one that
speaks plaintext or trusts another CA does not, and with client_ca set only a client holding a
certificate from that CA does."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.config import Config, SignalConfig, TlsConfig
from lowtide.errors import ConfigError
from lowtide_client import Client, SignalClient, TaskState, Worker
from lowtide_proto.channel import Security, open_channel
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import make_config
from tests.deploy.conftest import run_lowtide
from tests.helpers import eventually
from tests.security.certs import Pki
from tests.security.conftest import TOKENS, secured

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


def with_tls(pki: Pki, *, mutual: bool) -> Config:
    tls = TlsConfig(cert=str(pki.server.cert), key=str(pki.server.key), client_ca=str(pki.ca) if mutual else "")
    return replace(secured(make_config()), tls=tls)


@pytest.fixture
async def tls_scheduler(database_url: str, pki: Pki) -> AsyncIterator[Scheduler]:
    running = await start_scheduler(with_tls(pki, mutual=False), database_url=database_url)
    yield running
    await running.stop(grace=1.0)


@pytest.fixture
async def mtls_scheduler(database_url: str, pki: Pki) -> AsyncIterator[Scheduler]:
    running = await start_scheduler(with_tls(pki, mutual=True), database_url=database_url)
    yield running
    await running.stop(grace=1.0)


async def code_of(target: str, **security: Any) -> grpc.StatusCode:
    """How one health check over such a channel ends (no retries, unlike Client's calls)."""
    async with open_channel(target, Security(**security)) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def test_tls_lets_in_a_client_that_trusts_the_ca_only(tls_scheduler: Scheduler, pki: Pki) -> None:
    token = TOKENS["submitter"]
    async with Client(tls_scheduler.target, token=token, ca=str(pki.ca)) as client:
        task = await client.submit("echo", b"over tls")
        assert (await client.get(task.id)).payload == b"over tls"
    # Plaintext to a TLS port, or a client that trusts someone else's certificate: no connection.
    assert await code_of(tls_scheduler.target, ca=str(pki.ca)) == grpc.StatusCode.OK
    assert await code_of(tls_scheduler.target) == grpc.StatusCode.UNAVAILABLE
    assert await code_of(tls_scheduler.target, ca=pki.stranger.cert.read_bytes()) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_needs_a_client_certificate_from_the_ca(mtls_scheduler: Scheduler, pki: Pki) -> None:
    target, ca = mtls_scheduler.target, str(pki.ca)
    worker = Worker(
        target=target, slots=1, token=TOKENS["worker"], ca=ca, cert=str(pki.client.cert), key=str(pki.client.key)
    )

    @worker.activity("upper")
    def upper(payload: bytes) -> bytes:
        return payload.upper()

    async with (
        Client(target, token=TOKENS["submitter"], ca=ca, cert=str(pki.client.cert), key=str(pki.client.key)) as ok,
        worker,
    ):
        task = await ok.submit("upper", b"mutual")
        done = await ok.wait(task.id, timeout=timedelta(seconds=10))
        assert (done.state, done.result) == (COMPLETED, b"MUTUAL")
    assert await code_of(target, ca=ca) == grpc.StatusCode.UNAVAILABLE
    stranger = {"cert": str(pki.stranger.cert), "key": str(pki.stranger.key)}
    assert await code_of(target, ca=ca, **stranger) == grpc.StatusCode.UNAVAILABLE


async def test_the_signal_service_serves_tls_and_the_scheduler_reaches_it(database_url: str, pki: Pki) -> None:
    base = with_tls(pki, mutual=False)
    signal: SignalServer = await start_signal_service(base, database_url=database_url)
    try:
        async with SignalClient(signal.target, token=TOKENS["admin"], ca=str(pki.ca)) as admin:
            assert (await admin.set(123.0)).value == 123.0
        # The scheduler subscribes over TLS with its own token, and so sees the value.
        scheduler_config = replace(
            base,
            scheduler=replace(base.scheduler, signal_target=signal.target),
            auth=replace(base.auth, signal_token=TOKENS["worker"]),
            tls=replace(base.tls, signal_ca=str(pki.ca)),
        )
        scheduler = await start_scheduler(scheduler_config, database_url=database_url)
        try:
            loop = scheduler.dispatcher.holds
            await eventually(lambda: _value(loop), within=10)
        finally:
            await scheduler.stop(grace=0.5)
    finally:
        await signal.stop(grace=0.5)


async def _value(holds: Any) -> bool:
    return bool(holds.value == 123.0)


async def test_half_a_tls_config_is_refused(database_url: str, pki: Pki) -> None:
    config = replace(secured(make_config()), tls=TlsConfig(cert=str(pki.server.cert)))
    with pytest.raises(ConfigError, match="cert and key go together"):
        await start_scheduler(config, database_url=database_url)
    missing = replace(
        secured(make_config()),
        signal=SignalConfig(listen="127.0.0.1:0", metrics_listen=""),
        tls=TlsConfig(cert="/nonexistent.crt", key="/nonexistent.key"),
    )
    with pytest.raises(ConfigError, match=r"\[tls\] key: cannot read"):
        await start_signal_service(missing, database_url=database_url)


async def test_lowtide_health_probes_a_mutual_tls_scheduler_with_the_cli_environment(
    mtls_scheduler: Scheduler, pki: Pki
) -> None:
    target = mtls_scheduler.target
    tls = {"LOWTIDE_CA": str(pki.ca), "LOWTIDE_CERT": str(pki.client.cert), "LOWTIDE_KEY": str(pki.client.key)}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LOWTIDE_CA", "LOWTIDE_CERT", "LOWTIDE_KEY"))}
    ran = await run_lowtide("health", "--target", target, env=clean | tls)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"server at {target}: SERVING"
    # Plaintext to a TLS port: not serving, and the probe says why.
    ran = await run_lowtide("health", "--target", target, "--timeout", "2", env=clean)
    assert ran.returncode == 1
    assert f"server at {target}: UNAVAILABLE" in ran.stderr
