"""Reading the facts: the database (on a read-only connection), the workers' records, and each
service process's memory and descriptors from /proc."""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg

from lowtide.db.queries import parse_queries
from soak.facts import Execution, Sample, SignalPoint, TaskRow

QUERIES = parse_queries(resources.files("soak").joinpath("queries.sql").read_text())


def _row(record: tuple[Any, ...]) -> TaskRow:
    (id_, key, activity, state, attempt, worker, started, released, signal, start_at, tolerance_ms, hit, missed) = (
        record[:13]
    )
    reason, tag = record[13], record[14]
    return TaskRow(
        id=int(id_),
        key=key,
        tag=tag or None,
        activity_type=activity,
        state=state,
        attempt=int(attempt),
        worker_id=worker,
        started_at=started,
        released_by=released,
        signal_at_dispatch=signal,
        start_at=start_at,
        start_tolerance=None if tolerance_ms is None else tolerance_ms / 1000,
        start_hit=hit,
        missed=bool(missed),
        miss_reason=reason,
    )


async def _read(url: str, query: str, params: dict[str, Any], wait: int = 10) -> list[tuple[Any, ...]]:
    # Read-only: the checker must never change what it judges.
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=wait, options="-c default_transaction_read_only=on"
    ) as conn:
        cursor = await conn.execute(QUERIES[query], params)
        return list(await cursor.fetchall())


async def tasks(url: str) -> list[TaskRow]:
    return [_row(r) for r in await _read(url, "tasks", {"after": 0}, wait=60)]


async def unfinished(url: str) -> list[TaskRow]:
    return [_row(r) for r in await _read(url, "unfinished", {})]


async def signal_history(url: str, name: str, after: float) -> list[SignalPoint]:
    return [
        SignalPoint(float(at), float(v)) for at, v in await _read(url, "signal_history", {"name": name, "after": after})
    ]


def executions(files: Iterable[Path]) -> list[Execution]:
    """The attempts the workers ran, a begin line and (unless the worker died first) an end line
    each; a line cut short by a kill is skipped."""
    begun: dict[tuple[int, int, int], dict[str, Any]] = {}
    ended: list[Execution] = []
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                fact = json.loads(line)
            except json.JSONDecodeError:
                continue
            ident = (int(fact["p"]), int(fact["t"]), int(fact["a"]))
            if "s" in fact:
                begun[ident] = fact
            elif ident in begun:
                start = begun.pop(ident)
                ended.append(Execution(fact["w"], ident[0], ident[1], ident[2], start["s"], fact["e"], fact["ok"]))
    return ended + [Execution(f["w"], int(f["p"]), int(f["t"]), int(f["a"]), f["s"]) for f in begun.values()]


def sample(name: str, pid: int, at: float) -> Sample | None:
    """The process's resident memory and open descriptors now; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    rss = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return Sample(name, pid, at, rss, fds)
