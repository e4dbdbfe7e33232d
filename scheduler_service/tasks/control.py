"""One task after its submission: read, cancelled, retried, explained. Between the servicer and the store.

`TaskControl` answers GetTask, CancelTask, RetryTask and ExplainTask: who may cancel or retry
what, the stop sent to the worker that runs a cancelled attempt, and the facts and surroundings
the pure `explain` reads.
"""

from __future__ import annotations

from collections.abc import Mapping

from lowtide import errors
from lowtide.auth import SUBMITTER
from lowtide.config import Config, TokenEntry
from lowtide.errors import InvalidArgument, NotFound
from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.domain.explain import Surroundings, TaskFacts, explain
from scheduler_service.domain.retry import RetryVerdict, retry_verdict
from scheduler_service.fleet.sessions import Registry
from scheduler_service.rows.tasks import CancelledRow, TaskRow
from scheduler_service.store import Store


def facts_of(row: TaskRow) -> TaskFacts:
    return TaskFacts(
        state=row.state,
        queue=row.queue,
        kind=row.kind,
        activity_type=row.activity_type,
        attempt=row.attempt,
        run_at=row.run_at,
        created_at=row.created_at,
        worker_id=row.worker_id,
        started_at=row.started_at,
        hold_deadline=row.hold_deadline,
        released_by=row.released_by,
        dependencies_pending=max(0, row.deps_pending),
        planned_release_at=row.planned_release_at,
        planned_intensity=row.planned_intensity,
        plan_reason=row.plan_reason,
        planned_pool=row.planned_pool,
        latest_start=row.latest_start,
    )


class TaskControl:
    def __init__(self, *, config: Config, store: Store, registry: Registry, dispatcher: Dispatcher) -> None:
        self._config = config
        self._store = store
        self._registry = registry
        self._dispatcher = dispatcher

    async def get(self, task_id: int) -> TaskRow:
        if task_id <= 0:
            raise InvalidArgument("id", "must be a positive task id")
        row = await self._store.get_task(task_id)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return row

    async def _may_change(self, task_id: int, who: TokenEntry | None) -> None:
        """Refuses a bad id, and a submitter's change to a task it did not submit."""
        if task_id <= 0:
            raise InvalidArgument("id", "must be a positive task id")
        if who is not None and who.role == SUBMITTER:
            owner = (await self.get(task_id)).submitted_by
            if owner != who.name:
                raise errors.PermissionDenied(f"task {task_id} was not submitted by token {who.name!r}")

    async def cancel(self, task_id: int, who: TokenEntry | None) -> CancelledRow:
        """Ends a pending or running task as cancelled and stops its attempt on the worker (a
        submitter may cancel only what it submitted; admins anything)."""
        await self._may_change(task_id, who)
        row = await self._store.cancel(task_id)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        if row.previous_state == "running" and row.worker_id:
            session = self._registry.get(row.worker_id)
            if session is not None:
                session.cancel([(row.id, row.attempt)])
        return row

    async def retry(self, task_id: int, who: TokenEntry | None, if_attempt: int | None = None) -> TaskRow:
        """Runs a task that ended without completing again (domain.retry says which may be, and
        when a call that says which end it saw changes nothing); a submitter may retry only what
        it submitted, admins anything."""
        await self._may_change(task_id, who)

        def verdict(row: TaskRow, dependencies: Mapping[int, str]) -> RetryVerdict:
            return retry_verdict(
                row.state,
                row.attempt,
                fixed_start=row.start_at is not None,
                dependencies=dependencies,
                if_attempt=if_attempt,
            )

        row, refused = await self._store.retry(task_id, verdict)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        if refused is not None:
            raise errors.FailedPrecondition(f"task {task_id} cannot be retried: {refused}")
        return row

    async def explain(self, task_id: int) -> tuple[TaskRow, str, list[str]]:
        """The task, why it is where it is (a sentence) and the reasons as codes."""
        row = await self.get(task_id)
        holds = self._dispatcher.holds
        limit_config = self._config.types.get(row.activity_type)
        limit = limit_config.max_concurrency if limit_config else None
        adaptive = self._dispatcher.adaptive.states.get(row.activity_type)
        limited = limit is not None or adaptive is not None
        pending = row.state == "pending"
        env = Surroundings(
            now=await self._store.now(),
            queue_paused_since=(await self._store.paused_queues()).get(row.queue),
            held=row.activity_type in holds.held_for(row.queue),
            # The hold of the signal this type follows (its reason names the signal).
            hold=holds.following(row.queue, row.activity_type).state,
            limit=limit,
            adaptive_limit=adaptive.value if adaptive else None,
            adaptive_reason=adaptive.reason if adaptive else "",
            running_of_type=await self._store.running_of_type(row.activity_type) if pending and limited else 0,
            workers_for_type=await self._store.workers_for_type(row.queue, row.activity_type) if pending else 0,
        )
        text, codes = explain(facts_of(row), env)
        return row, text, codes
