"""Where a timed run's CPU went, by role: the scheduler, the workers, and PostgreSQL's processes
(the backends of the run's own database, see `run_backends`), from their user and system time in
/proc (Linux; elsewhere nothing is reported). Given per task, the figure the MEASURED notes and the
issues speak in: a drain's throughput on 2 cores is bounded by what a task costs in all."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

_PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """The process's user and system time so far, in seconds (OSError when it is gone)."""
    # The command name (2nd field) may hold spaces and parentheses: split after its last ')'.
    fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _cpu_s(pid: int) -> float | None:
    """cpu_seconds, or None when the process is gone or unreadable."""
    try:
        return cpu_seconds(pid)
    except (OSError, IndexError):
        return None


def _postgres_pids() -> list[int]:
    pids = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class CpuWindow:
    """CPU time by role between `start()` and `per_task()`. `roles` maps a role to its pids;
    "postgres" is added: the postgres processes (narrowed by `backends`), those that start
    meanwhile (a pool's new connections) counted from zero. A process that exits before the end (a peer's worker and its
    connection's backend, once the queue is empty) counts up to the last `sample()` that saw it.
    The benchmark's own progress queries are in PostgreSQL's share, for lowtide and the peers
    alike.

    `backends`, when given, narrows "postgres" to those pids (see `run_backends`): on a machine
    other work shares, the server's other backends are not this run's."""

    def __init__(self, roles: Mapping[str, Sequence[int]], backends: set[int] | None = None) -> None:
        self._roles = {role: list(pids) for role, pids in roles.items()}
        self._start: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._postgres: set[int] = set()
        self.backends = backends
        self.available = _PROC.is_dir()

    def _postgres_now(self) -> list[int]:
        # The run's backends are known: reading every process of the machine (tens of ms, in the
        # event loop of a load generator) would be a stall counted against the system it loads.
        return _postgres_pids() if self.backends is None else list(self.backends)

    def start(self) -> None:
        if not self.available:
            return
        self._postgres = set(self._postgres_now())
        pids = [pid for pids in self._roles.values() for pid in pids] + sorted(self._postgres)
        self._start = {pid: cpu for pid in pids if (cpu := _cpu_s(pid)) is not None}
        self._last = dict(self._start)

    def sample(self) -> None:
        """Reads every process now; call it while waiting for the end."""
        if not self.available:
            return
        self._postgres.update(self._postgres_now())
        for pid in [pid for pids in self._roles.values() for pid in pids] + sorted(self._postgres):
            if (cpu := _cpu_s(pid)) is not None:
                self._last[pid] = cpu

    def per_task(self, tasks: int) -> dict[str, float] | None:
        """Microseconds of CPU per task, by role and in all; None where /proc is not there."""
        if not self.available or tasks < 1:
            return None
        self.sample()
        used: dict[str, float] = {}
        for role, pids in [*self._roles.items(), ("postgres", sorted(self._postgres))]:
            seconds = sum(max(0.0, self._last.get(pid, 0.0) - self._start.get(pid, 0.0)) for pid in pids)
            used[role] = round(seconds / tasks * 1e6, 1)
        used["total"] = round(sum(used.values()), 1)
        return used


async def backends_of(conn: psycopg.AsyncConnection[Any]) -> set[int]:
    """The PostgreSQL backends connected to the database of `conn` now (its own included)."""
    cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
    return {int(r[0]) for r in await cur.fetchall()}


@asynccontextmanager
async def run_backends(conn: psycopg.AsyncConnection[Any], every: float = 0.5) -> AsyncIterator[set[int]]:
    """The backends of the run's database (that of `conn`, which each run has to itself): those
    connected now, and those that connect while the block runs (a pool growing), added every
    `every` seconds. PostgreSQL's share of a run is theirs; the server's shared background
    processes and other databases' backends (other work on a shared machine) are not counted.
    Every benchmark that reports PostgreSQL's CPU counts it this way."""
    backends = await backends_of(conn)

    async def follow() -> None:
        while True:
            await asyncio.sleep(every)
            backends.update(await backends_of(conn))

    follower = asyncio.create_task(follow())
    try:
        yield backends
    finally:
        follower.cancel()
