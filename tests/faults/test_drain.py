"""A scheduler stopped while a Python and a Node worker process each run an attempt: both get a
Drain, finish the attempt and report it before the scheduler is gone (the results are on record
when stop() returns), and both connect by themselves to the next scheduler on the same address
and take work from it."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from lowtide_client import Client, TaskState, Worker, task_spec
from scheduler_service.fleet.sessions import WorkerSession
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.deploy.node import ensure_node_modules, node_or_skip
from tests.faults.support import (
    Relay,
    connected_workers,
    counting_worker,
    free_port,
    kill_all,
    logs_of,
    nap_worker,
    query,
)
from tests.helpers import eventually

RUNNING = TaskState.Value("TASK_STATE_RUNNING")
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


async def test_a_stopping_scheduler_drains_busy_workers_and_they_reconnect_to_the_next(
    database_url: str, tmp_path: Path
) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    config = make_config(listen=f"127.0.0.1:{free_port()}", lease_timeout=timedelta(seconds=10))
    first = await start_scheduler(config, database_url=database_url)
    second = None
    out, py_log, node_log = tmp_path / "py.txt", tmp_path / "py.log", tmp_path / "node.log"
    processes = [
        counting_worker(first.target, out, slots=2, worker_id="py-drain", log=py_log, nap=1.5, level="INFO"),
        nap_worker(node, first.target, "node-drain", node_log),
    ]
    logs = [py_log, node_log]
    try:
        names = {"py-drain", "node-drain"}

        async def both_connected() -> bool:
            return await connected_workers(database_url) == names

        await eventually(both_connected, within=60, interval=0.1)
        async with Client(first.target) as client:
            on_python = await client.submit("nap", "p1")
            on_node = await client.submit("n_nap", "n1")

            async def both_running() -> bool:
                tasks = [await client.get(t.id) for t in (on_python, on_node)]
                return [t.state for t in tasks] == [RUNNING, RUNNING] and _text(out).split() == ["p1"]

            await eventually(both_running, within=30)
        await first.stop(grace=20.0)
        # Drained, not cut: each attempt finished on its worker and its result is on record.
        ids = f"{on_python.id}, {on_node.id}"
        rows = await query(
            database_url,
            f"SELECT id, state, attempt, result, worker_id FROM lowtide.tasks WHERE id IN ({ids}) ORDER BY id",
        )
        assert rows == [
            (on_python.id, "completed", 1, b"p1", "py-drain"),
            (on_node.id, "completed", 1, b"n1", "node-drain"),
        ], logs_of(logs)
        assert "worker.drain_requested" in _text(py_log), logs_of(logs)
        assert "drain the scheduler is shutting down" in _text(node_log), logs_of(logs)

        second = await start_scheduler(config, database_url=database_url)
        mine = second.scheduler_id

        async def both_on_the_next() -> bool:
            rows = await query(database_url, f"SELECT id FROM lowtide.workers WHERE scheduler_id = '{mine}'")
            return {str(r[0]) for r in rows} == names

        try:
            await eventually(both_on_the_next, within=60, interval=0.1)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{logs_of(logs)}") from None
        async with Client(second.target) as client:
            for activity, payload, worker_id in (("nap", "p2", "py-drain"), ("n_nap", "n2", "node-drain")):
                task = await client.submit(activity, payload)
                done = await client.wait(task.id, timeout=timedelta(seconds=30))
                assert (done.state, done.worker_id, done.result) == (COMPLETED, worker_id, payload.encode())
        assert all(p.poll() is None for p in processes), logs_of(logs)
    finally:
        kill_all(processes)
        if second is not None:
            await second.stop(grace=1.0)


class _OnEvent(logging.Handler):
    """Calls `seen` for each lowtide_client record of `event` for `worker_id`."""

    def __init__(self, event: str, worker_id: str, seen: Callable[[], None]) -> None:
        super().__init__(logging.INFO)
        self._event, self._worker_id, self._seen = event, worker_id, seen

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "lowtide_fields", {})
        if getattr(record, "lowtide_event", None) == self._event and fields.get("worker_id") == self._worker_id:
            self._seen()


class _Leaving:
    """A worker that runs one long attempt (`payload` "last") and is then stopped: the Python
    library in this process, or the Node one in a process of its own."""

    def __init__(self, kind: str, target: str, log: Path, *, nap_ms: int = 8000) -> None:
        self.kind = kind
        self.activity = "slow" if kind == "python" else "n_nap"
        self.worker_id = f"leaving-{kind}"
        self.ran: list[bytes] = []
        self._log = log
        self._release = asyncio.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._running: asyncio.Task[None] | None = None
        self._welcomes = 0
        if kind == "python":
            # The library logs each Welcome it reads (worker.connected); a Node worker prints one.
            self._handler = _OnEvent("worker.connected", self.worker_id, self._welcomed)
            library = logging.getLogger("lowtide_client")
            self._level = library.level
            library.setLevel(logging.INFO)
            library.addHandler(self._handler)
            self._worker = Worker(target=target, worker_id=self.worker_id, slots=4)
            self._worker.register("slow", self._slow)
            self._running = asyncio.create_task(self._worker.run())
        else:
            # By default its nap outlasts a scheduler's replacement; it ends by itself.
            self._process = nap_worker(node_or_skip(), target, self.worker_id, log, nap_ms=nap_ms)

    def _welcomed(self) -> None:
        self._welcomes += 1

    def welcomed(self) -> bool:
        """Whether the worker has read a Welcome (not only been sent one)."""
        if self._process is None:
            return self._welcomes > 0
        return f"welcome {self.worker_id}" in _text(self._log)

    async def _slow(self, payload: bytes) -> bytes:
        self.ran.append(payload)
        if payload == b"last":
            await self._release.wait()
        return payload

    def started(self, payload: bytes) -> bool:
        """Whether the worker has started the attempt of `payload` (not only been sent it)."""
        if self._process is None:
            return payload in self.ran
        return f"started {payload.decode()}" in _text(self._log)

    def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)
        else:
            self._worker.stop()

    async def finish(self) -> None:
        """Lets the last attempt end and waits for the worker to stop."""
        self._release.set()
        if self._running is not None:
            await asyncio.wait_for(self._running, 30)
        if self._process is not None:
            process = self._process

            async def exited() -> bool:
                return process.poll() is not None

            await eventually(exited, within=30)

    async def close(self) -> None:
        self._release.set()
        if self._process is None:
            library = logging.getLogger("lowtide_client")
            library.removeHandler(self._handler)
            library.setLevel(self._level)
        if self._running is not None:
            self._worker.stop()
            await asyncio.gather(self._running, return_exceptions=True)
        if self._process is not None:
            kill_all([self._process])


@pytest.mark.parametrize("kind", ["python", "node"])
async def test_a_stopping_worker_that_reconnects_to_report_takes_no_new_work(
    database_url: str, tmp_path: Path, kind: str
) -> None:
    # A worker is stopping (it has told its scheduler it wants no more work) while an attempt of
    # it still runs, and the scheduler is replaced. The worker connects to the next one to report
    # the attempt. The claim that scheduler makes for a stream that has just opened must find no
    # slot of it free: work handed to a worker on its way out waits for it, and once it closes,
    # what it declines comes back as WorkerLost, an attempt spent for nothing.
    if kind == "node":
        await ensure_node_modules()
    config = make_config(listen=f"127.0.0.1:{free_port()}", lease_timeout=timedelta(seconds=10))
    first = await start_scheduler(config, database_url=database_url)
    second = None
    # The worker is a few milliseconds away, as on another host: on loopback its answer to the
    # Welcome would come back before the scheduler's first claim for it is done.
    path = Relay(first.target, delay=0.01)
    log = tmp_path / "worker.log"
    worker = _Leaving(kind, await path.start(), log)

    def session_on(scheduler: Scheduler) -> WorkerSession | None:
        return scheduler.parts.registry.get(worker.worker_id)

    try:
        async with Client(first.target) as client:
            last = await client.submit(worker.activity, b"last")

            async def last_runs() -> bool:
                return worker.started(b"last")

            await eventually(last_runs, within=30)
            worker.stop()

            async def wants_nothing() -> bool:
                session = session_on(first)
                return session is not None and session.slots == 0

            await eventually(wants_nothing, within=30)
        # The attempt outlasts the drain's grace: the stream ends, the attempt stays the worker's.
        await first.stop(grace=0.2)
        second = await start_scheduler(config, database_url=database_url)
        async with Client(second.target) as client:
            waiting = [t.id for t in await client.submit_many(task_spec(worker.activity, b"new") for _ in range(8))]

            async def back_with_its_attempt() -> bool:
                session = session_on(second)
                return session is not None and last.id in session.in_flight

            await eventually(back_with_its_attempt, within=60, interval=0.05)
            await worker.finish()
            done = await client.get(last.id)
            assert (done.state, done.attempt, done.result) == (COMPLETED, 1, b"last"), _text(log)
            assert b"new" not in worker.ran, "the stopping worker was given new work"
            attempts = [(await client.get(t)).attempt for t in waiting]
            assert attempts == [0] * len(waiting), f"new work handed to the stopping worker: {attempts}\n{_text(log)}"
    finally:
        await worker.close()
        await first.stop(grace=0.2)
        if second is not None:
            await second.stop(grace=1.0)
        await path.close()


@pytest.mark.parametrize("welcomed", [True, False], ids=["after_its_welcome", "at_once"])
@pytest.mark.parametrize("kind", ["python", "node"])
async def test_a_worker_stopped_while_work_is_on_its_way_to_it_runs_that_work(
    scheduler: Scheduler, tmp_path: Path, kind: str, welcomed: bool
) -> None:
    # The scheduler has sent the worker an assignment that is still on the wire (the worker is
    # 200 ms away) when the worker is told to stop, with nothing else running: after the worker
    # read its Welcome, or at once (the Welcome still on the wire too, unless the machine is slow
    # enough to let it arrive first: the outcome must be the same). It must not take "nothing
    # runs" for "done": until the scheduler answers its SlotUpdate(0), work sent before may
    # arrive, and it runs. Declined, it came back as WorkerLost, an attempt spent unrun.
    if kind == "node":
        await ensure_node_modules()
    path = Relay(scheduler.target, delay=0.2)
    log = tmp_path / "worker.log"
    worker = _Leaving(kind, await path.start(), log, nap_ms=50)
    try:
        async with Client(scheduler.target) as client:

            async def connected() -> bool:
                return scheduler.parts.registry.get(worker.worker_id) is not None

            await eventually(connected, within=30)
            if welcomed:

                async def read_its_welcome() -> bool:
                    return worker.welcomed()

                await eventually(read_its_welcome, within=30)
            task = await client.submit(worker.activity, b"on-its-way")

            async def sent() -> bool:
                session = scheduler.parts.registry.get(worker.worker_id)
                return session is not None and task.id in session.in_flight

            await eventually(sent, within=30, interval=0.005)
            worker.stop()
            done = await client.wait(task.id, timeout=timedelta(seconds=30))
            await worker.finish()
            assert (done.state, done.attempt, done.worker_id) == (COMPLETED, 1, worker.worker_id), _text(log)
    finally:
        await worker.close()
        await path.close()
