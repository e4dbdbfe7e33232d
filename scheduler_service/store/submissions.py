"""The writes of a submission, inside one transaction: what tasks/submission.py decides, stored.

Each method is one statement for the whole batch (or one per queue or pool it locks), never one per task.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from lowtide.db.connector import Database, Transaction
from lowtide.db.queries import positional
from scheduler_service.domain.fixed import Interval, Reservation
from scheduler_service.domain.model import NewTask, Outcome
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.domain.submission import Overload
from scheduler_service.rows.tasks import (
    DepthRow,
    EndedRow,
    FinishedRow,
    KeyedRow,
    ReservationRow,
    StateRow,
    TaskRow,
)
from scheduler_service.store.base import SEPARATOR, Q, StoreBase, ms
from scheduler_service.store.tasks import finish_params, settle

T = TypeVar("T")

# Over psycopg's 4 KB of statements it parses once: sent positional.
_INSERT_FINISHING = positional(Q["insert_tasks_handed_finishing"])

# A bound on the memory of registered queues; past it the next submit registers again.
_MAX_REGISTERED = 10_000


class _Columns(NamedTuple):
    """A task's values, one a column of the insert, named as _insert_tasks and _insert_handed read
    them (a batch: an array a column; a group of single submits: an object a task)."""

    queue: str
    kind: str
    activity_type: str
    payload: bytes
    priority: int
    idempotency_key: str | None
    max_attempts: int
    initial_backoff_ms: int | None
    backoff_coefficient: float
    max_backoff_ms: int | None
    non_retryable: str
    schedule_to_start_ms: int | None
    start_to_close_ms: int | None
    heartbeat_ms: int | None
    max_defer_ms: int | None
    # The duration of a task with a latest start (for planning), or a fixed start's estimate.
    estimated_duration_ms: int | None
    pool: str
    start_at: datetime | None
    start_tolerance_ms: int | None
    on_miss: str | None
    resources: str | None
    latest_start: datetime | None
    planned_release_at: datetime | None
    planned_intensity: float | None
    plan_reason: str | None
    headers: str
    allowed_pools: str | None
    planned_pool: str | None
    signal_at_submit: float | None


def _task_values(t: NewTask, signal: float | None) -> _Columns:
    return _Columns(
        queue=t.queue,
        kind=t.kind.value,
        activity_type=t.activity_type,
        payload=t.payload,
        priority=t.priority,
        idempotency_key=t.idempotency_key,
        max_attempts=t.retry.max_attempts,
        initial_backoff_ms=ms(t.retry.initial_backoff),
        backoff_coefficient=t.retry.backoff_coefficient,
        max_backoff_ms=ms(t.retry.max_backoff),
        non_retryable=SEPARATOR.join(t.retry.non_retryable_error_types),
        schedule_to_start_ms=ms(t.schedule_to_start),
        start_to_close_ms=ms(t.start_to_close),
        heartbeat_ms=ms(t.heartbeat),
        max_defer_ms=ms(t.max_defer),
        estimated_duration_ms=ms(t.fixed.estimated_duration) if t.fixed else ms(t.duration),
        pool=t.pool,
        start_at=t.fixed.start_at if t.fixed else None,
        start_tolerance_ms=ms(t.fixed.tolerance) if t.fixed else None,
        on_miss=t.fixed.on_miss.value if t.fixed else None,
        resources=json.dumps(dict(t.resources)) if t.resources else None,
        latest_start=t.latest_start,
        planned_release_at=t.planned_release_at,
        planned_intensity=t.planned_intensity,
        plan_reason=t.plan_reason,
        headers=json.dumps(dict(t.headers)),
        allowed_pools=SEPARATOR.join(t.pools) or None,
        planned_pool=t.planned_pool,
        signal_at_submit=signal,
    )


def task_columns(tasks: Sequence[NewTask], signals: Sequence[float | None]) -> dict[str, list[Any]]:
    """The batch as one array per column of the insert (_insert_tasks), `signals` the value each
    task records at submission."""
    rows = [_task_values(t, s) for t, s in zip(tasks, signals, strict=True)]
    columns = zip(*rows, strict=True) if rows else [()] * len(_Columns._fields)
    return {name: list(column) for name, column in zip(_Columns._fields, columns, strict=True)}


def handed_group(tasks: Sequence[NewTask], workers: Sequence[str | None], signals: Sequence[float | None]) -> str:
    """The group of _insert_handed (its %(group)s): a JSON array of an object a task, keyed by
    column, and the worker each is handed to. One parameter where psycopg would dump an array a
    column, in Python (0.2 ms of the scheduler's CPU a group of single submits). Bytes go as
    bytea's hex text, datetimes in ISO 8601."""
    rows = [{**_task_values(t, s)._asdict(), "worker": w} for t, w, s in zip(tasks, workers, signals, strict=True)]
    return _GROUP_JSON.encode(rows)


def _json_value(value: Any) -> str:
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column value")


# Text as it is (no \u escapes): PostgreSQL reads it in the connection's encoding, as it reads text
# parameters; an escape of a character above ASCII fails in a database whose encoding has no such
# character (in SQL_ASCII, every one).
_GROUP_JSON = json.JSONEncoder(default=_json_value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


class SubmissionWrites:
    """The reads and writes of one submission: in its transaction, or, for a submission that is
    a single insert, on the database itself (each statement commits on its own)."""

    def __init__(self, tx: Transaction | Database, registered: set[str], *, planned: bool = False) -> None:
        self._tx = tx
        # The insert on the connections that keep one generic plan (Database.transaction's
        # `planned`), when it commits on its own.
        self._planned = planned and isinstance(tx, Database)
        self._registered = registered
        self.registering: set[str] = set()
        # The tasks as stored, when the insert returned them whole (see insert).
        self.stored: dict[int, TaskRow] = {}
        # The reports the insert wrote too (see insert's `finishing`), by (id, attempt).
        self.finished: dict[tuple[int, int], FinishedRow] = {}

    async def existing(self, keys: Sequence[str], submitted_by: str | None) -> dict[str, int]:
        """The ids of the tasks this submitter stored before under these idempotency keys."""
        params = {"keys": list(keys), "submitted_by": submitted_by}
        rows = await self._tx.fetch_as(KeyedRow, Q["tasks_by_idempotency_key"], params)
        return {r.idempotency_key: r.id for r in rows if r.idempotency_key is not None}

    async def dependency_states(self, ids: Sequence[int]) -> dict[int, str]:
        """The states of these tasks, locked until commit so none ends unseen meanwhile."""
        rows = await self._tx.fetch_as(StateRow, Q["lock_dependencies"], {"ids": list(ids)})
        return {r.id: r.state for r in rows}

    async def lock_pools(self, pools: Sequence[str]) -> None:
        await self._tx.execute(Q["lock_pools"], {"pools": list(pools)})

    async def booked(self, pool: str, span: Interval) -> list[Reservation]:
        """The pool's reservations overlapping the span (its pool locked first)."""
        params = {"pool": pool, "window_start": span.start, "window_end": span.end}
        rows = await self._tx.fetch_as(ReservationRow, Q["overlapping_reservations"], params)
        return [Reservation(r.task_id, Interval(r.window_start, r.window_end)) for r in rows]

    async def queue_depths(self, limited: Mapping[str, Overload]) -> dict[str, int]:
        """Claimable pending tasks of each limited queue (held types not counted), the queues locked."""
        await self._tx.execute(Q["lock_queues"], {"queues": sorted(limited)})
        depths = {}
        for queue, limit in limited.items():
            params = {"queue": queue, "held": sorted(limit.held)}
            row = await self._tx.fetch_one_as(DepthRow, Q["claimable_depth"], params)
            depths[queue] = row.depth if row else 0
        return depths

    async def register_queues(self, queues: Iterable[str]) -> None:
        """Records the queues in lowtide.queues, once per replica."""
        unregistered = set(queues) - self._registered
        if unregistered:
            await self._tx.execute(Q["register_queues"], {"queues": sorted(unregistered)})
        self.registering |= unregistered

    async def insert(
        self,
        tasks: Sequence[NewTask],
        *,
        deps_pending: Sequence[int],
        signal: float | None,
        submitted_by: str | None,
        wake: str,
        whole: bool = False,
        workers: Sequence[str | None] | None = None,
        signals: Sequence[float | None] | None = None,
        finishing: Sequence[tuple[Outcome, str | None]] = (),
    ) -> list[tuple[int, str | None]]:
        """Stores the tasks whose key is new in one statement, which also wakes every replica's
        dispatch at commit with the `wake` payload if any was stored; returns (id, key) of each
        one stored. `whole`: the statement also returns each task as stored, kept in `stored`.
        `workers` (plain tasks only, whole): the worker each task is handed to, or None (see
        insert_tasks_handed: a task handed is stored running, if its queue and worker allow).
        `signal` is the default signal's value, `signals` the value each task records at
        submission (by default `signal`). `finishing` (whole, alone): workers' reports (each with
        the worker that sent it) applied in the same statement, those of tasks nothing depends on
        (_finish_lent); the ones applied are kept in `finished`."""
        recorded = list(signals) if signals is not None else [signal] * len(tasks)
        params: dict[str, Any] = {
            "submitted_by": submitted_by,
            "signal": signal,
            "release_lead": RELEASE_LEAD,
            "wake": wake,
        }
        if finishing or (workers is not None and any(workers)):
            assert whole, "a group handed to slots is returned whole"
            params["group"] = handed_group(tasks, workers or [None] * len(tasks), recorded)
            if finishing:
                stored = await self._insert_finishing(params, finishing)
            else:
                stored = await self._fetch_as(TaskRow, Q["insert_tasks_handed"], params)
        else:
            params.update(task_columns(tasks, recorded), deps_pending=list(deps_pending))
            if not whole:
                rows = await self._tx.fetch_as(KeyedRow, Q["insert_tasks"], params)
                return [(r.id, r.idempotency_key) for r in rows]
            stored = await self._fetch_as(TaskRow, Q["insert_tasks_whole"], params)
        self.stored.update((r.id, r) for r in stored)
        return [(r.id, r.idempotency_key) for r in stored]

    async def _insert_finishing(
        self, params: dict[str, Any], finishing: Sequence[tuple[Outcome, str | None]]
    ) -> list[TaskRow]:
        """insert_tasks_handed_finishing: the group and the reports in one statement, one round trip
        and one commit; the reports applied are kept in `finished`."""
        assert isinstance(self._tx, Database), "reports are written with an insert that commits on its own"
        params = {**params, **finish_params(finishing)}
        rows = await self._tx.fetch_positional(TaskRow, _INSERT_FINISHING, params, planned=self._planned)
        for _, finished in rows:
            for i, attempt, state, has_dependents, queue, activity_type, seconds in finished or ():
                run_time = None if seconds is None else timedelta(seconds=seconds)
                row = FinishedRow(i, attempt, state, has_dependents, queue, activity_type, run_time)
                self.finished[(i, attempt)] = row
        return [task for task, _ in rows]

    async def _fetch_as(self, cls: type[T], sql: str, params: dict[str, Any]) -> list[T]:
        if self._planned:
            assert isinstance(self._tx, Database)
            return await self._tx.fetch_as(cls, sql, params, planned=True)
        return await self._tx.fetch_as(cls, sql, params)

    async def reserve(self, fixed: Sequence[tuple[int, NewTask]]) -> None:
        """Books the windows of the fixed starts just created."""
        windows = [(task_id, t.pool, t.fixed.window) for task_id, t in fixed if t.fixed]
        params = {
            "task_ids": [w[0] for w in windows],
            "pools": [w[1] for w in windows],
            "starts": [w[2].start for w in windows],
            "ends": [w[2].end for w in windows],
        }
        await self._tx.execute(Q["insert_reservations"], params)

    async def shed(self, queue: str, limit: Overload, count: int) -> None:
        """Ends `count` claimable tasks of the queue by its policy (and fails their dependents)."""
        params = {"queue": queue, "held": sorted(limit.held), "count": count, "reason": limit.shed_reason(queue)}
        assert isinstance(self._tx, Transaction), "a queue with a max_depth is written in a transaction"
        shed = await self._tx.fetch_as(EndedRow, Q[limit.policy], params)
        await settle(self._tx, shed)

    async def link_dependencies(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Stores (task, the task it depends on) pairs."""
        params = {"task_ids": [p[0] for p in pairs], "depends_on": [p[1] for p in pairs]}
        await self._tx.execute(Q["insert_dependencies"], params)


class SubmissionStore(StoreBase):
    @asynccontextmanager
    async def submitting(self, *, alone: bool = False, planned: bool = False) -> AsyncIterator[SubmissionWrites]:
        """One submission's transaction, or none when the submission is `alone` a single insert
        (nothing read first, nothing locked: no idempotency keys, dependencies, fixed starts or
        queue depth limits), which commits on its own. The queues it registered are remembered
        once it is written. `planned` (with `alone`): the insert runs where statements keep one
        generic plan (see SubmitGroups' writers, tasks/submission.py)."""
        if alone:
            writes = SubmissionWrites(self.db, self.registered_queues, planned=planned)
            yield writes
        else:
            async with self.db.transaction() as tx:
                writes = SubmissionWrites(tx, self.registered_queues)
                yield writes
        if len(self.registered_queues) > _MAX_REGISTERED:
            self.registered_queues.clear()
        self.registered_queues |= writes.registering

    async def stored_under_keys(self, keys: Sequence[str], submitted_by: str | None) -> dict[str, int]:
        """The ids of the tasks this submitter stored before under these idempotency keys (read
        outside any submission: for a re-submit that would not be accepted as a new task)."""
        return await SubmissionWrites(self.db, set()).existing(keys, submitted_by)
