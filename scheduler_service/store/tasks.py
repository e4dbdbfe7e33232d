"""Tasks through their lives: reads, attempts ending, cancellation, and the dependents that follow."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from lowtide.db.connector import Transaction
from scheduler_service.domain.model import Attempt, Outcome, State
from scheduler_service.domain.retry import RetryVerdict
from scheduler_service.domain.submission import ENDED_UNCOMPLETED, wake_payload
from scheduler_service.rows.tasks import (
    AttemptRow,
    CancelledRow,
    EndedRow,
    ExpiredRow,
    FinishedRow,
    StateRow,
    TaskId,
    TaskRow,
    UnblockedRow,
)
from scheduler_service.store.base import SEPARATOR, Q, StoreBase, attempt_of


class Ended(Protocol):
    """What settling needs of a task that just ended: an EndedRow, a TaskRow, a marked miss."""

    @property
    def id(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def has_dependents(self) -> bool: ...


async def settle(tx: Transaction, ended: Sequence[Ended]) -> list[UnblockedRow]:
    """Dependents of tasks that just ended: released when their last dependency completed,
    failed (transitively) when one ended otherwise. Returns the released ones."""
    completed = [r.id for r in ended if r.has_dependents and r.state == "completed"]
    failed = [r.id for r in ended if r.has_dependents and r.state in ENDED_UNCOMPLETED]
    released: list[UnblockedRow] = []
    if completed:
        rows = await tx.fetch_as(UnblockedRow, Q["release_dependents"], {"ids": completed})
        released = [r for r in rows if r.deps_pending <= 0]
        if released:
            await tx.execute(Q["notify_wake"], {"payload": "*"})
    if failed:
        await tx.execute(Q["fail_dependents"], {"ids": failed})
    return released


def retries_due(
    outcomes: Iterable[Outcome], applied: Mapping[tuple[int, int], FinishedRow]
) -> dict[datetime, set[tuple[str, str]]]:
    """When the retries among the outcomes that were applied are due, with the (queue, type)
    pairs due then: what the dispatcher is to be woken for (Dispatcher.wake_at)."""
    due: dict[datetime, set[tuple[str, str]]] = {}
    for outcome in outcomes:
        if outcome.state is State.PENDING and outcome.run_at is not None:
            row = applied.get((outcome.task_id, outcome.attempt))
            if row is not None:
                due.setdefault(outcome.run_at, set()).add((row.queue, row.activity_type))
    return due


def finish_params(outcomes: Sequence[tuple[Outcome, str | None]]) -> dict[str, list[Any] | None]:
    """finish_attempts' arrays, one element per outcome. Those of failures and retries go as
    NULL (unnest pads them with NULLs) when no outcome in the batch has any: a batch of successes
    sends five arrays, not nine with four of them all NULL."""
    failures = [o.failure for o, _ in outcomes]
    run_ats = [o.run_at for o, _ in outcomes]
    failed = any(f is not None for f in failures)
    return {
        "ids": [o.task_id for o, _ in outcomes],
        "attempts": [o.attempt for o, _ in outcomes],
        "worker_ids": [worker_id for _, worker_id in outcomes],
        "states": [o.state.value for o, _ in outcomes],
        "results": [o.result for o, _ in outcomes],
        "error_types": [f.error_type if f else None for f in failures] if failed else None,
        "error_messages": [f.message if f else None for f in failures] if failed else None,
        "error_non_retryable": [f.non_retryable if f else None for f in failures] if failed else None,
        "run_ats": run_ats if any(r is not None for r in run_ats) else None,
    }


class TaskStore(StoreBase):
    async def get_task(self, task_id: int) -> TaskRow | None:
        return await self.db.fetch_one_as(TaskRow, Q["get_task"], {"id": task_id})

    async def list_tasks(
        self,
        *,
        queue: str | None,
        state: str | None,
        activity_type: str | None,
        before_id: int | None,
        from_id: int | None = None,
        limit: int,
    ) -> list[TaskRow]:
        """A page of tasks, newest first, whole but for their payloads and results (left empty):
        ids below `before_id` and from `from_id` on (None: no bound)."""
        params = {
            "queue": queue,
            "state": state,
            "activity_type": activity_type,
            "before_id": before_id,
            "from_id": from_id,
            "limit": limit,
        }
        # By state alone, on the state's index; filtered by queue or type too, in the window of
        # ids the caller gives (from_id), on the primary key.
        by_state = state is not None and queue is None and activity_type is None
        return await self.db.fetch_as(TaskRow, Q["list_tasks_in_state" if by_state else "list_tasks"], params)

    async def next_task_id(self) -> int:
        """One above the newest task's id (1 with no tasks)."""
        row = await self.db.fetch_one_as(TaskId, Q["next_task_id"])
        assert row is not None
        return row.id

    def _unblocked(self, rows: list[UnblockedRow]) -> None:
        if rows:
            self.on_unblocked(rows)

    async def finish(
        self,
        outcomes: Sequence[tuple[Outcome, str | None]],
        applied: dict[tuple[int, int], FinishedRow] | None = None,
    ) -> dict[tuple[int, int], FinishedRow]:
        """Applies outcomes (each with the worker that reported it, or None for the scheduler's own
        verdicts); returns the attempts applied, by (id, attempt). The rest were stale.

        Most tasks have no dependents: theirs are applied in one statement, without a transaction
        around it. What that leaves (tasks with dependents, stale reports) goes the whole way, with
        the dependents settled in the same transaction. So a failure may come after a part was
        written: `applied` (filled in place) keeps that part for the caller's next try, which
        then skips it and still counts it as applied."""
        applied = {} if applied is None else applied
        todo = [(o, worker) for o, worker in outcomes if (o.task_id, o.attempt) not in applied] if applied else outcomes
        if not todo:
            return applied
        rows = await self.db.fetch_as(FinishedRow, Q["finish_independent_attempts"], finish_params(todo))
        applied.update({(r.id, r.attempt): r for r in rows})
        if len(rows) == len(todo):
            return applied
        rest = [(o, worker) for o, worker in todo if (o.task_id, o.attempt) not in applied]
        if not rest:
            return applied
        async with self.db.transaction() as tx:
            rows = await tx.fetch_as(FinishedRow, Q["finish_attempts"], finish_params(rest))
            released = await settle(tx, rows) if any(r.has_dependents for r in rows) else []
        self._unblocked(released)
        applied.update({(r.id, r.attempt): r for r in rows})
        return applied

    async def running_attempts_of(self, worker_id: str, scheduler_id: str) -> list[Attempt]:
        """The attempts the worker runs, unless it is connected to another replica than this one."""
        params = {"worker_id": worker_id, "scheduler_id": scheduler_id}
        rows = await self.db.fetch_as(AttemptRow, Q["running_attempts_of_worker"], params)
        return [attempt_of(r) for r in rows]

    async def adopt(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> list[Attempt]:
        """The attempts of `refs` that still run on the worker (a reconnect takes them back)."""
        params = {"worker_id": worker_id, "ids": [r[0] for r in refs], "attempts": [r[1] for r in refs]}
        return [attempt_of(r) for r in await self.db.fetch_as(AttemptRow, Q["adopt_attempts"], params)]

    async def expired_attempts(self, limit: int = 1000) -> list[ExpiredRow]:
        return await self.db.fetch_as(ExpiredRow, Q["expired_attempts"], {"limit": limit})

    async def expire_schedule_to_start(self, limit: int = 1000) -> int:
        async with self.db.transaction() as tx:
            rows = await tx.fetch_as(EndedRow, Q["expire_schedule_to_start"], {"limit": limit})
            await settle(tx, rows)
        return len(rows)

    async def heartbeat(self, beats: Sequence[tuple[str, int, int, int]]) -> None:
        """Pushes back the heartbeat deadlines of the attempts listed by heartbeats, (worker id, task
        id, attempt, ms since the heartbeat arrived) each, in one statement for every worker."""
        await self.db.execute(
            Q["heartbeat_attempts"],
            {
                "workers": SEPARATOR.join(b[0] for b in beats),
                "ids": [b[1] for b in beats],
                "attempts": [b[2] for b in beats],
                "ages": [b[3] for b in beats],
            },
        )

    async def heartbeat_details(self, worker_id: str, details: Sequence[tuple[int, int, bytes]]) -> None:
        await self.db.execute(
            Q["heartbeat_details"],
            {
                "worker_id": worker_id,
                "ids": [d[0] for d in details],
                "attempts": [d[1] for d in details],
                "details": [d[2] for d in details],
            },
        )

    async def retry(
        self, task_id: int, verdict: Callable[[TaskRow, Mapping[int, str]], RetryVerdict]
    ) -> tuple[TaskRow | None, str | None]:
        """Makes the task pending again unless `verdict` (given the task, locked, and the state of
        each task it depends on) refuses or keeps it as it is. Returns the task as it is now and
        None, the task unchanged and the reason, or (None, None) when there is no such task."""
        async with self.db.transaction() as tx:
            row = await tx.fetch_one_as(TaskRow, Q["lock_task"], {"id": task_id})
            if row is None:
                return None, None
            states = await tx.fetch_as(StateRow, Q["dependency_states_of"], {"id": task_id})
            dependencies = {r.id: r.state for r in states}
            decided = verdict(row, dependencies)
            if decided.refused is not None or decided.as_is:
                return row, decided.refused
            waiting = sum(1 for state in dependencies.values() if state in ("pending", "running"))
            retried = await tx.fetch_one_as(TaskRow, Q["retry_task"], {"id": task_id, "deps_pending": waiting})
            # Every replica's dispatch (this one's too, through its listener) looks at its type.
            await tx.execute(Q["notify_wake"], {"payload": wake_payload([row])})
            return retried, None

    async def cancel(self, task_id: int) -> CancelledRow | None:
        async with self.db.transaction() as tx:
            row = await tx.fetch_one_as(CancelledRow, Q["cancel_task"], {"id": task_id})
            if row is not None and row.previous_state == "running" and row.worker_id:
                await tx.execute(Q["notify_cancel"], {"payload": f"{row.id}:{row.attempt}:{row.worker_id}"})
            if row is not None and row.previous_state in ("pending", "running"):
                await settle(tx, [row])
            return row
