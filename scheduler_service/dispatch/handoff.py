"""A new task handed straight to an idle slot of this replica, in the statement that stores it.

A single submit while a worker of this replica has a free slot needs no wake-up and no claim: the
group writer (tasks/submit_groups.py) reserves a slot per task here, the insert stores each task
as its first attempt on that slot's worker (insert_tasks_handed, which still leaves it pending
when its queue is paused, the worker's lease ran out or older due work of its queue and type
waits), and what was stored running is sent to the worker as a claim's rows are. Only what a
claim would start at once is handed: no type under a concurrency limit (static or adaptive), none
the cost hold holds for the worker, none that needs named resources or waits for a planned
release or a fixed start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.domain.model import NewTask
from scheduler_service.fleet.sessions import Registry, WorkerSession
from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.rows.tasks import TaskRow


class Handoff:
    def __init__(self, dispatcher: Dispatcher, registry: Registry) -> None:
        self._dispatcher = dispatcher
        self._registry = registry

    def reserve(self, tasks: Sequence[NewTask]) -> list[WorkerSession | None]:
        """A free slot for each task that may be handed, reserved (as a claim reserves the slots
        it fills) until `release`; None for a task that goes the usual way."""
        limits = self._dispatcher.limits()
        out: list[WorkerSession | None] = []
        for task in tasks:
            session = None
            if not (task.resources or task.fixed or task.planned_release_at or task.activity_type in limits):
                session = self._free_session(task)
            if session is not None:
                session.claiming += 1
            out.append(session)
        return out

    def _free_session(self, task: NewTask) -> WorkerSession | None:
        for group in self._registry.groups():
            key = group.key
            if task.queue not in key.queues or task.activity_type not in key.activity_types:
                continue
            # Not to a pool that names none of its pools, nor to one bound to a signal of its own:
            # the insert records the default signal's value, and a task there counts its carbon
            # on its pool's (a claim records that).
            if (task.pools and key.pool not in task.pools) or self._dispatcher.holds.own_signal(key.pool):
                continue
            # Held, or held until its signal's view is confirmed (which a claim does, not a hand).
            if task.activity_type in self._dispatcher.held_map(key, confirmed=True).get(task.queue, frozenset()):
                continue
            for session in group.members.values():
                # A session whose key changed is regrouped by the next claim first.
                if session.free > 0 and not session.regroup:
                    return session
        return None

    @staticmethod
    def release(sessions: Iterable[WorkerSession | None]) -> None:
        """Gives back the slots `reserve` took."""
        for session in sessions:
            if session is not None:
                session.claiming -= 1

    async def send(self, sessions: Sequence[WorkerSession | None], rows: Iterable[TaskRow]) -> None:
        """Sends each task stored running to the worker it was handed to (the reservations still
        held: the slots stay taken until the attempts are in flight)."""
        running = [claimed_row(r) for r in rows if r.state == "running"]
        if not running:
            return
        by_worker = {s.worker_id: s for s in sessions if s is not None}
        counts = Counter(r.worker_id for r in running)
        await self._dispatcher.hand_over([(by_worker[w], n) for w, n in counts.items()], running)


def claimed_row(row: TaskRow) -> ClaimedRow:
    """The attempt a handed task started, as a claim returns one (rows/claims.py)."""
    assert row.worker_id is not None and row.started_at is not None
    return ClaimedRow(
        row.id,
        row.attempt,
        row.worker_id,
        row.queue,
        row.kind,
        row.activity_type,
        row.payload,
        row.max_attempts,
        row.initial_backoff_ms,
        row.backoff_coefficient,
        row.max_backoff_ms,
        row.non_retryable_error_types,
        row.close_deadline,
        row.heartbeat_ms,
        row.priority,
        row.run_at,
        row.start_at,
        row.start_tolerance_ms,
        row.start_hit,
        row.pool,
        row.headers or None,
        row.started_at,
        row.released_by,
        row.hold_deadline,
        # Only a task held by a planned release has one, and such a task is never handed.
        None,
        row.signal_at_dispatch,
        row.signal_at_submit,
    )
