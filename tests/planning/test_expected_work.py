"""Planned release beside the work expected to come, through the real services: the leader reads
the last day's deferrable submissions and leaves a contested cheap window to the work that will
have no other."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from lowtide_client import Client, SignalClient
from signal_service.domain import Point
from tests.helpers import eventually
from tests.planning.test_release import _planned_near, _services


async def test_the_leader_leaves_a_cheap_window_to_the_work_expected_from_the_last_day(
    database_url: str, tmp_path: Path
) -> None:
    signal, scheduler = await _services(database_url, tmp_path, "static")
    try:
        now = datetime.now(UTC)
        cheap = now + timedelta(minutes=60)
        async with Client(scheduler.target) as client, SignalClient(signal.target) as signals:
            await signals.set(300)
            # Yesterday, a `train` task was submitted at this time of day plus 55 minutes, with
            # 30 minutes of slack: the same is expected in 55 minutes, and the only cheap start
            # in its window is the one at 60 minutes. (The history is written into its row: the
            # API submits at now.)
            yesterday = await client.submit(
                "train", latest_start=now + timedelta(hours=1), estimated_duration=timedelta(minutes=10)
            )
            await client.cancel(yesterday.id)
            submitted = now + timedelta(minutes=55) - timedelta(days=1)
            await scheduler.db.execute(
                "UPDATE lowtide.tasks SET created_at = %(at)s, latest_start = %(at)s + interval '30 minutes'"
                " WHERE id = %(id)s",
                {"at": submitted, "id": yesterday.id},
            )
            # A task pending now may start any time in the next two hours: at 60 minutes (50) or
            # at 5 (120). The pool has one slot (no worker is connected).
            task = await client.submit(
                "train", latest_start=now + timedelta(hours=2), estimated_duration=timedelta(minutes=10)
            )
            await signal.signals.set_forecast(
                "grid",
                [
                    Point(now + timedelta(minutes=5), 120.0),
                    Point(now + timedelta(minutes=30), 300.0),
                    Point(cheap, 50.0),
                    Point(cheap + timedelta(minutes=10), 300.0),
                    Point(now + timedelta(hours=3), 300.0),
                ],
                source="test-feed",
            )
            # Moving costs the pending task 70 and the expected one 250: the pending task moves.
            moved = await eventually(lambda: _planned_near(client, task.id, now + timedelta(minutes=5)))
            assert moved
            planned = await client.get(task.id)
            assert planned.planned_intensity == 120
    finally:
        await scheduler.stop(grace=0.5)
        await signal.stop(grace=0.5)
