"""A listen port is one process's: a second scheduler started on a port one already serves is
refused with one line (grpc's SO_REUSEPORT, on by default, would have let the two split the
connections between them), and so is a metrics port that is taken; the first keeps serving."""

from __future__ import annotations

import os
import socket

import pytest

from lowtide.errors import EXIT_CONFIG, ConfigError
from lowtide_client import Client
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.deploy.conftest import run_lowtide


def _serve_env(database_url: str, listen: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    env.update(
        LOWTIDE_AUTH="off",
        LOWTIDE_DATABASE_URL=database_url,
        LOWTIDE_SCHEDULER_LISTEN=listen,
        LOWTIDE_SCHEDULER_METRICS_LISTEN="",
    )
    return env


async def test_a_second_scheduler_on_a_port_in_use_exits_with_a_message_and_the_first_keeps_serving(
    scheduler: Scheduler, database_url: str
) -> None:
    second = await run_lowtide("scheduler", "serve", env=_serve_env(database_url, scheduler.target), within=60)

    assert second.returncode == EXIT_CONFIG, second.stderr[-2000:]
    assert (
        f"lowtide: [scheduler] listen: cannot listen on {scheduler.target}: address already in use" in second.stderr
    ), second.stderr[-2000:]
    assert "Traceback" not in second.stderr
    health = await run_lowtide("health", "--target", scheduler.target)
    assert health.returncode == 0, health.stderr
    async with Client(scheduler.target) as client:
        task = await client.submit("echo", b"still here")
    assert task.id > 0


async def test_a_scheduler_started_in_process_on_a_port_in_use_is_refused(scheduler: Scheduler) -> None:
    with pytest.raises(ConfigError, match=r"^\[scheduler\] listen: cannot listen on .*: address already in use"):
        await start_scheduler(make_config(listen=scheduler.target), database_url=scheduler.db.url)


async def test_a_taken_metrics_port_is_refused_with_the_setting_it_comes_from(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError) as refused:
            await start_scheduler(make_config(metrics_listen=listen), database_url=database_url)
    expected = f"[scheduler] metrics_listen: cannot listen on {listen}: address already in use"
    assert str(refused.value).startswith(expected), refused.value
