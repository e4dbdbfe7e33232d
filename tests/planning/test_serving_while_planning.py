"""The leader plans in a thread of its own, through the real services: while it plans a batch of
held tasks on a new forecast, the scheduler still answers calls, a stop neither waits for the
planning nor lets it write (nor counts as a failure), and a bug in the planning still fails the
replica, as when it planned on the event loop.

The planning is held at a gate (the real plan_tasks, made to wait for the test's word) instead of
made long with many tasks: a test of "answered while it planned" then says what came first, not
how long each took. The gate gives up after GIVE_UP seconds, which only a planning that held the
event loop (the test's own too) ever waits for."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lowtide.db import Database
from lowtide_client import Client, SignalClient, task_spec
from scheduler_service.holds import release_planning
from signal_service.domain import Point
from signal_service.server import SignalServer
from tests.helpers import eventually
from tests.planning.test_release import _services

TASKS = 200
GIVE_UP = 15.0


class Gate:
    """Holds the first planning on a forecast after `armed` is set until `open` is set (or
    GIVE_UP)."""

    def __init__(self, plan: Callable[..., Any]) -> None:
        self._plan = plan
        self.armed = threading.Event()
        self.open = threading.Event()
        self.started = threading.Event()
        self.finished = threading.Event()
        self.thread: int | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.armed.is_set() or self.started.is_set() or args[0].forecast is None:
            return self._plan(*args, **kwargs)
        self.thread = threading.get_ident()
        self.started.set()
        self.open.wait(GIVE_UP)
        try:
            return self._plan(*args, **kwargs)
        finally:
            self.finished.set()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    held = Gate(release_planning.plan_tasks)
    monkeypatch.setattr(release_planning, "plan_tasks", held)
    return held


async def _submit_and_forecast(client: Client, signal: SignalServer, gate: Gate) -> list[int]:
    """TASKS held `train` tasks that may start in the next two hours, then a forecast with a cheap
    hour in it, whose planning the gate holds."""
    now = datetime.now(UTC)
    async with SignalClient(signal.target) as signals:
        await signals.set(300)
    specs = [
        task_spec("train", latest_start=now + timedelta(hours=2), estimated_duration=timedelta(minutes=10))
        for _ in range(TASKS)
    ]
    ids = [t.id for t in await client.submit_many(specs)]
    gate.armed.set()
    points = [(5, 300.0), (60, 50.0), (70, 300.0), (180, 300.0)]
    await signal.signals.set_forecast("grid", [Point(now + timedelta(minutes=m), v) for m, v in points], source="test")
    await eventually(lambda: _true(gate.started.is_set()), within=GIVE_UP + 5)
    return ids


async def _true(value: bool) -> bool:
    return value


async def test_the_scheduler_answers_while_the_leader_plans(database_url: str, tmp_path: Path, gate: Gate) -> None:
    signal, scheduler = await _services(database_url, tmp_path, "static")
    try:
        async with Client(scheduler.target) as client:
            ids = await _submit_and_forecast(client, signal, gate)
            task = await client.get(ids[0])
            assert not gate.finished.is_set(), "the call was answered only once the planning had ended"
            assert task.id == ids[0] and not task.HasField("planned_release_at")
            assert gate.thread != threading.get_ident()
            gate.open.set()

            # Planned as before once it may go on: on the forecast, into the cheap hour.
            async def planned() -> bool:
                return (await client.get(ids[-1])).HasField("planned_release_at")

            assert await eventually(planned)
            planned_first = await client.get(ids[0])
            assert "(forecast: test #" in planned_first.plan_reason
    finally:
        gate.open.set()
        await scheduler.stop(grace=0.5)
        await signal.stop(grace=0.5)


async def test_a_stop_does_not_wait_for_the_planning_and_nothing_it_planned_is_written(
    database_url: str, tmp_path: Path, gate: Gate
) -> None:
    signal, scheduler = await _services(database_url, tmp_path, "static")
    try:
        async with Client(scheduler.target) as client:
            await _submit_and_forecast(client, signal, gate)
        await scheduler.stop(grace=0.5)
        assert not gate.finished.is_set(), "the stop waited for the planning"
        # The tick cancelled at its await, and the thread closed: a stop, not a failure (exit 0).
        assert not scheduler.failed.is_set()
    finally:
        gate.open.set()
        await signal.stop(grace=0.5)
    await eventually(lambda: _true(gate.finished.is_set()))
    # No task has a plan made on the forecast.
    db = Database(database_url, min_size=1, max_size=1)
    await db.open()
    try:
        rows = await db.fetch("SELECT planned_release_at, plan_reason FROM lowtide.tasks", {})
    finally:
        await db.close()
    assert len(rows) == TASKS
    assert all(r["planned_release_at"] is None and "(forecast:" not in (r["plan_reason"] or "") for r in rows)


async def test_a_planning_that_fails_in_its_thread_fails_the_replica(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The error a planning raises in the planner's thread ends the leader's loop, which marks
    the replica failed (`serve` stops it and exits 1): a planning bug is not lost in the thread."""
    real = release_planning.plan_tasks

    def broken(*args: Any, **kwargs: Any) -> Any:
        if args[0].forecast is None:
            return real(*args, **kwargs)
        raise RuntimeError("a bug in the planning")

    # Let through at once: the gate only says when the planning on the forecast began, and where.
    gate = Gate(broken)
    gate.open.set()
    monkeypatch.setattr(release_planning, "plan_tasks", gate)
    caplog.set_level(logging.CRITICAL, logger="lowtide.scheduler")
    signal, scheduler = await _services(database_url, tmp_path, "static")
    try:
        async with Client(scheduler.target) as client:
            await _submit_and_forecast(client, signal, gate)
        await eventually(lambda: _true(scheduler.failed.is_set()))
        assert gate.thread != threading.get_ident()
        [record] = [r for r in caplog.records if r.getMessage() == "scheduler.loop_failed"]
        assert record.exc_info is not None and "a bug in the planning" in str(record.exc_info[1])
    finally:
        await scheduler.stop(grace=0.5)
        await signal.stop(grace=0.5)
