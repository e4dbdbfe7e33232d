"""What `lowtide status` reads (GetStatus) against a real scheduler and database: a pool's busy
slots are never more than its slots, and agree with the queues' running counts."""

from __future__ import annotations

from lowtide_client import Client
from lowtide_proto.lowtide.v1 import worker_pb2
from scheduler_service.server import Scheduler
from tests.faults.support import RawWorker, query
from tests.helpers import eventually


async def test_a_leaving_worker_s_running_attempts_keep_their_slots_in_the_pool_figures(
    scheduler: Scheduler, database_url: str
) -> None:
    async with Client(scheduler.target) as client:
        staying = RawWorker(scheduler.target, "staying", slots=2)
        leaving = RawWorker(scheduler.target, "leaving", slots=2)
        try:
            await staying.connect()
            await leaving.connect()
            for n in range(4):
                await client.submit("count", str(n).encode())

            async def all_running() -> bool:
                status = await client.status()
                return sum(q.running for q in status.queues) == 4

            await eventually(all_running, within=30)
            # How a worker leaves (as every client library does on shutdown): no new work, while
            # its two attempts run on.
            await leaving.call.write(worker_pb2.WorkerMessage(slot_update=worker_pb2.SlotUpdate(slots=0)))

            async def recorded() -> bool:
                rows = await query(database_url, "SELECT slots FROM lowtide.workers WHERE id = 'leaving'")
                return [tuple(r) for r in rows] == [(0,)]

            await eventually(recorded, within=30)
            status = await client.status()
            pools = [(p.workers, p.slots, p.busy_slots) for p in status.pools if p.name == "default"]
            # Four attempts run in four slots: the leaving worker's two still take theirs.
            assert pools == [(2, 4, 4)]
            assert sum(q.running for q in status.queues) == 4
        finally:
            await staying.close()
            await leaving.close()
