"""The next planned release in each pool, as GetStatus gives it and the console's Regions section
shows it: the soonest of all the held tasks placed there, however many are pending (the console
reads one page of pending tasks, 1,000 of the newest)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lowtide.console import regions
from lowtide.console.backend import PENDING_PAGE
from lowtide.db import Database
from lowtide_client import Client, TaskState
from lowtide_proto.lowtide.v1 import scheduler_pb2
from scheduler_service.server import Scheduler

PENDING = TaskState.Value("TASK_STATE_PENDING")

# Held tasks placed in eu-central by a plan: the oldest is released first (in an hour), the
# newer ones later, one a minute from two hours on.
_PLACED = (
    "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, "
    "backoff_coefficient, max_backoff_ms, latest_start, estimated_duration_ms, pools, planned_pool, "
    "planned_release_at, planned_intensity, run_at) "
    "SELECT 'default', 'activity', 'train', '', 3, 1000, 2.0, 60000, now() + interval '1 day', 60000, "
    "'{eu-west,eu-central}', 'eu-central', "
    "CASE WHEN i = 0 THEN now() + interval '1 hour' ELSE now() + interval '2 hours' + i * interval '1 minute' END, "
    "CASE WHEN i = 0 THEN 140 ELSE 200 END, now() + interval '1 day' "
    "FROM generate_series(0, %(count)s - 1) AS i ORDER BY i"
)


async def test_the_next_release_in_a_pool_is_the_soonest_of_all_its_placed_tasks(
    scheduler: Scheduler, database_url: str
) -> None:
    count = PENDING_PAGE + 200
    db = Database(database_url, min_size=1, max_size=1)
    await db.open()
    try:
        await db.execute(_PLACED, {"count": count})
    finally:
        await db.close()
    async with Client(scheduler.target) as client:
        status = await client.status()
        page = await client.list(state=PENDING, page_size=PENDING_PAGE)
    pools = {p.name: p for p in status.pools}
    central = pools["eu-central"]
    # The page the console reads does not hold the soonest (the oldest task)...
    assert len(page.tasks) == PENDING_PAGE and page.next_page_token
    first = min(page.tasks, key=lambda t: t.id).id
    assert central.next_release_task_id < first and not any(t.id == central.next_release_task_id for t in page.tasks)
    # ...the scheduler's count and next release do.
    assert central.planned_releases == count
    in_an_hour = datetime.now(UTC) + timedelta(hours=1)
    assert abs(central.next_release_at.ToDatetime(tzinfo=UTC) - in_an_hour) < timedelta(minutes=1)
    assert central.next_release_intensity == 140
    assert not pools.get("eu-west", scheduler_pb2.PoolStatus()).next_release_task_id
    # And so does the console's line for the region.
    central.signal = "de"
    [region] = regions.regions(scheduler_pb2.GetStatusResponse(pools=[central]), page.tasks, {}, now=0.0)
    line = regions.releases_line(region)
    assert line.startswith(f"{count} held task(s) planned to be released here: the next at ")
    assert line.endswith(f"(task {central.next_release_task_id}, forecast 140).")
