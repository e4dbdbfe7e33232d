"""on_stale = release and a scheduler that starts while the signal service is unreachable: it
has no value to release, holds, and says so."""

from __future__ import annotations

import socket

from lowtide_client import Client, TaskState
from scheduler_service.server import start_scheduler
from tests.cost.conftest import cost_config

PENDING = TaskState.Value("TASK_STATE_PENDING")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_scheduler_started_during_a_signal_outage_holds_and_says_release_cannot_apply(
    database_url: str,
) -> None:
    config = cost_config(f"127.0.0.1:{closed_port()}", on_stale="release")
    scheduler = await start_scheduler(config, database_url=database_url)
    try:
        async with Client(scheduler.target) as client:
            task = await client.submit("train")
            explained = await client.explain(task.id)
            status = await client.status()
    finally:
        await scheduler.stop(grace=0.5)
    assert explained.task.state == PENDING and explained.reasons[0] == "cost_hold"
    assert "no signal value has arrived yet (on_stale = release does not apply" in explained.explanation
    assert status.hold.active and "on_stale = release does not apply" in status.hold.reason
