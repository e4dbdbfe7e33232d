"""A worker's stream outlives a short database outage: a heartbeat that cannot reach the database
is deferred (the next one renews the lease), not a reason to end the stream and lose its attempt."""

from __future__ import annotations

from datetime import timedelta

import pytest
from psycopg import conninfo

from lowtide_client import Client, TaskState
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2
from scheduler_service.server import start_scheduler
from tests.conftest import make_config
from tests.faults.support import RawWorker
from tests.faults.test_database_health import cut_off
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def test_heartbeats_during_a_database_outage_keep_the_stream_and_its_attempt(
    pg_server_url: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    dbname = conninfo.conninfo_to_dict(database_url)["dbname"]
    assert isinstance(dbname, str)
    # Leases far longer than the outage: only the heartbeats' handling can end the stream.
    config = make_config(lease_timeout=timedelta(seconds=60), leader_lease=timedelta(seconds=60))
    scheduler = await start_scheduler(config, database_url=database_url)
    raw = RawWorker(scheduler.target, "steady")
    caplog.set_level("WARNING", logger="lowtide")
    try:
        async with Client(scheduler.target) as client:
            task = await client.submit("count", "1", max_attempts=1)
            await raw.connect()
            while (message := await raw.read()).WhichOneof("message") != "assignments":
                pass
            ref = message.assignments.assignments[0].task
            heartbeat = worker_pb2.WorkerMessage(
                heartbeat=worker_pb2.Heartbeat(running=[task_pb2.TaskRef(task_id=ref.task_id, attempt=ref.attempt)])
            )
            cut_off(pg_server_url, dbname, allow=False)
            try:

                async def deferred() -> bool:
                    # One heartbeat after another, until the scheduler has met the outage with one.
                    await raw.call.write(heartbeat)
                    return any(r.msg == "worker.heartbeat_deferred" for r in caplog.records)

                await eventually(deferred, within=60, interval=0.3)
            finally:
                cut_off(pg_server_url, dbname, allow=True)
            await raw.call.write(heartbeat)
            await raw.report([(ref.task_id, ref.attempt)], result=b"after the outage")
            done = await client.wait(task.id, timeout=timedelta(seconds=30))
            assert (done.state, done.attempt, done.result) == (COMPLETED, 1, b"after the outage")
    finally:
        await raw.close()
        await scheduler.stop(grace=0.5)
