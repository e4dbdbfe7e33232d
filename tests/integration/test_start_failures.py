"""A service that fails to start, at any step, leaves nothing open behind it: no connection of
its pool in PostgreSQL, no listening port (a second start in the same process, as `lowtide up`
restarts a service, gets them again)."""

from __future__ import annotations

import socket
from dataclasses import replace

import psycopg
import pytest
from grpc_health.v1 import health

from lowtide.config import SignalDefinition
from lowtide.errors import ConfigError
from scheduler_service.server import start_scheduler
from signal_service.server import start_signal_service
from tests.conftest import make_config
from tests.helpers import bindable, eventually, free_port
from tests.signal.conftest import signal_config


async def _connections(database_url: str) -> int:
    """Backends connected to the test's database (other than this probe)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def _none_left(database_url: str) -> bool:
    return await _connections(database_url) == 0


async def test_a_scheduler_failing_after_its_pool_opened_closes_the_pool_and_its_ports(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last step of the start (health goes SERVING) fails: the pool is open, the server started.
    async def refuse(self: health.aio.HealthServicer, service: str, status: object) -> None:
        raise ConfigError("refused at the last step of the start")

    monkeypatch.setattr(health.aio.HealthServicer, "set", refuse)
    listen, metrics = free_port(), free_port()
    config = make_config(listen=f"127.0.0.1:{listen}", metrics_listen=f"127.0.0.1:{metrics}")
    config = replace(config, database=replace(config.database, pool_min=3))

    with pytest.raises(ConfigError, match="last step"):
        await start_scheduler(config, database_url=database_url)

    await eventually(lambda: _none_left(database_url), within=30)
    assert bindable(listen), "the scheduler's gRPC port stayed bound"
    assert bindable(metrics), "the scheduler's metrics port stayed bound"


async def test_a_scheduler_refused_by_a_listen_check_frees_the_metrics_port_it_had_bound(
    database_url: str,
) -> None:
    metrics = free_port()
    # Not loopback with auth off: refused, after the metrics port was bound.
    refused = make_config(listen="0.0.0.0:0", metrics_listen=f"127.0.0.1:{metrics}")
    with pytest.raises(ConfigError, match="not a loopback address"):
        await start_scheduler(refused, database_url=database_url)

    # Fixed, and started again in the same process: the metrics port is free to take.
    running = await start_scheduler(make_config(metrics_listen=f"127.0.0.1:{metrics}"), database_url=database_url)
    try:
        assert running.metrics.metrics.port == metrics
    finally:
        await running.stop(grace=0.5)
    await eventually(lambda: _none_left(database_url), within=30)


async def test_a_signal_service_whose_metrics_port_is_taken_closes_its_pool_and_port(database_url: str) -> None:
    listen = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics = f"127.0.0.1:{taken.getsockname()[1]}"
        config = signal_config(
            {"price": SignalDefinition(unit="EUR/MWh", threshold=100.0)},
            listen=f"127.0.0.1:{listen}",
            metrics_listen=metrics,
        )
        # The metrics port is bound after the pool opened and the signals were read.
        with pytest.raises(ConfigError, match=r"\[signal\] metrics_listen"):
            await start_signal_service(config, database_url=database_url)

    await eventually(lambda: _none_left(database_url), within=30)
    assert bindable(listen), "the signal service's gRPC port stayed bound"
