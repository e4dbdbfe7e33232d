"""The submission use case: plan, admit, store, wake. Between the servicer (proto) and the store (SQL).

`store_tasks` is the one transaction of a submission: idempotency, dependencies, admission of
fixed starts, overload (reject or shed) and the writes, each decision a pure function of
scheduler_service.domain. `Submission` adds what a client's submission gets on top: its release
planned on the forecast, the queues' overload policy and the pools' capacity from the
configuration, and the wake-ups of dispatch and fixed starts once it is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from lowtide.config import Config
from lowtide.db import CommittedUnread, statement_aborted
from lowtide.errors import DatabaseUnavailable, FailedPrecondition, InvalidArgument, TooLarge
from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.dispatch.handoff import Handoff
from scheduler_service.domain.fixed import Interval, Refused, admit_all, reservation_capacity
from scheduler_service.domain.model import NewTask, Outcome
from scheduler_service.domain.submission import (
    Overload,
    Submitted,
    counted,
    ended_dependency,
    first_new,
    pending_dependencies,
    submitted,
    unknown_dependencies,
    wake_payload,
    wanted_dependencies,
)
from scheduler_service.fleet.sessions import WorkerSession
from scheduler_service.holds.fixed_starts import FixedStarts
from scheduler_service.holds.release_planning import ReleasePlanner
from scheduler_service.observe.tracing import with_trace_context
from scheduler_service.rows.tasks import FinishedRow, TaskRow
from scheduler_service.store import Store, SubmissionWrites
from scheduler_service.tasks.submit_groups import MAX_GROUP_BYTES, SubmitGroups

log = logging.getLogger("lowtide.scheduler.submission")

__all__ = ["Overload", "ReportsToWrite", "Submission", "Submitted", "store_tasks"]


class ReportsToWrite(Protocol):
    """The workers' reports not written yet (workers/completer.py), which a group of single submits
    writes in its insert's commit (docs/architecture/tasks.md)."""

    def submitted(self) -> None:
        """A single submit came: the pace that says how long a report may wait for the next."""

    def lend(self) -> tuple[int, list[tuple[Outcome, str | None]]]:
        """The reports waiting (each with the worker that sent it), lent under a key until given back."""

    def give_back(self, key: int, applied: Mapping[tuple[int, int], FinishedRow] | None) -> None:
        """The lent reports, and those the insert applied (None: its statement failed, none)."""


async def store_tasks(
    store: Store,
    tasks: Sequence[NewTask],
    *,
    signal: float | None = None,
    signals: Sequence[float | None] | None = None,
    submitted_by: str | None = None,
    capacity: Callable[[str], int] = lambda pool: 1,
    overload: Mapping[str, Overload] | None = None,
    origin: str | None = None,
    stored: dict[int, TaskRow] | None = None,
    workers: Sequence[str | None] | None = None,
    planned: bool = False,
    finishing: Sequence[tuple[Outcome, str | None]] = (),
    finished: dict[tuple[int, int], FinishedRow] | None = None,
) -> list[Submitted]:
    """Stores the tasks in one transaction (plain tasks in one statement) and returns their ids in order.

    A task whose idempotency key this submitter used already (stored before, or earlier in this batch) is not
    stored again: its entry carries the first task's id and created=False. Fixed starts are admitted first,
    under a per-pool lock, against the pool's `capacity`; one that does not fit raises Refused and nothing of
    the batch is stored. A queue over its max_depth refuses the batch (reject) or sheds work once it is stored
    (shed_lowest, shed_oldest). Every replica's dispatch is woken at commit (NOTIFY) but `origin`'s, which wakes
    its own. `stored`, when given, gets the tasks of a submission of plain tasks as the insert stored them
    (whole, so the caller need not read them back); other submissions leave it empty. With `stored` and plain
    tasks only, `workers`: the worker each is handed to, or None; `finishing`: workers' reports committed with
    the insert, those applied put in `finished` (see SubmissionWrites.insert). `planned`: a submission of plain
    tasks is inserted where the statement keeps one generic plan (SubmissionStore.submitting).
    """
    keys = [t.idempotency_key for t in tasks if t.idempotency_key]
    limited = {t.queue: overload[t.queue] for t in tasks if overload and t.queue in overload}
    alone = not limited and all(plain(t) for t in tasks)
    async with store.submitting(alone=alone, planned=planned) as writes:
        existing = await writes.existing(keys, submitted_by) if keys else {}
        fresh = first_new(tasks, existing)
        # Only what this submission creates is checked: a re-submit of a task stored before
        # answers that task, whatever its dependencies have done since.
        deps_pending = [0] * len(tasks)
        if any(tasks[i].depends_on for i in fresh):
            pending = await _dependencies(writes, [tasks[i] for i in fresh])
            for index, count in zip(fresh, pending, strict=True):
                deps_pending[index] = count
        if any(tasks[i].fixed for i in fresh):
            await _admit(writes, [(i, tasks[i]) for i in fresh if tasks[i].fixed], capacity)
        depths = await writes.queue_depths(limited) if limited else {}
        for queue, limit in limited.items():
            refusal = limit.rejection(queue, depths[queue], counted(limit, queue, (tasks[i] for i in fresh)))
            if refusal is not None:
                raise TooLarge(refusal)
        await writes.register_queues({t.queue for t in tasks})
        inserted = await writes.insert(
            tasks,
            deps_pending=deps_pending,
            signal=signal,
            signals=signals,
            submitted_by=submitted_by,
            wake=wake_payload(tasks, origin),
            whole=alone and stored is not None,
            workers=workers if alone and stored is not None else None,
            finishing=finishing if alone and stored is not None else (),
        )
        if stored is not None:
            stored.update(writes.stored)
        if finished is not None:
            finished.update(writes.finished)
        if len(inserted) < len(fresh) and keys:
            # Another submit with one of these keys committed meanwhile.
            existing = await writes.existing(keys, submitted_by)
        out = submitted(tasks, inserted, existing)
        created = [(s.id, t) for s, t in zip(out, tasks, strict=True) if s.created]
        if any(t.fixed for _, t in created):
            await writes.reserve([(i, t) for i, t in created if t.fixed])
        for queue, limit in limited.items():
            excess = limit.excess(depths[queue], counted(limit, queue, (t for _, t in created)))
            if excess > 0:
                await writes.shed(queue, limit, excess)
        dependent = [(i, d) for i, t in created for d in t.depends_on]
        if dependent:
            await writes.link_dependencies(dependent)
    return out


def plain(task: NewTask) -> bool:
    """A task whose submission is its insert alone: nothing to read or lock first (its queue's
    depth limit aside, which the caller knows)."""
    return not (task.idempotency_key or task.depends_on or task.fixed)


def groupable(task: NewTask) -> bool:
    """A single submit stored with others (tasks/submit_groups.py): a plain task whose payload
    fits a group."""
    return plain(task) and len(task.payload) <= MAX_GROUP_BYTES


async def _dependencies(writes: SubmissionWrites, tasks: Sequence[NewTask]) -> list[int]:
    """How many unfinished dependencies each task waits for; refuses unknown ones and ones
    that already ended without completing (the task could never run)."""
    wanted = wanted_dependencies(tasks)
    states = await writes.dependency_states(wanted)
    missing = unknown_dependencies(wanted, states)
    if missing:
        raise InvalidArgument("depends_on", f"no task {', '.join(map(str, missing))}")
    ended = ended_dependency(wanted, states)
    if ended is not None:
        raise FailedPrecondition(f"depends_on: task {ended[0]} already ended {ended[1]}, so this task could never run")
    return pending_dependencies(tasks, states)


async def _admit(
    writes: SubmissionWrites, fixed: Sequence[tuple[int, NewTask]], capacity: Callable[[str], int]
) -> None:
    """Refuses (Refused, with the batch index) the first fixed start its pool has no room for."""
    pools = sorted({t.pool for _, t in fixed})
    await writes.lock_pools(pools)
    for pool in pools:
        mine = [(i, t.fixed.window) for i, t in fixed if t.pool == pool and t.fixed]
        span = Interval(min(w.start for _, w in mine), max(w.end for _, w in mine))
        refused = admit_all(mine, await writes.booked(pool, span), capacity(pool))
        if refused is not None:
            raise Refused(pool, *refused)


class Submission:
    """A client's submission: planned, admitted under the configured limits, stored, announced."""

    def __init__(
        self,
        *,
        config: Config,
        store: Store,
        dispatcher: Dispatcher,
        fixed: FixedStarts,
        planner: ReleasePlanner,
        tracing: bool,
        scheduler_id: str,
        handoff: Handoff,
        reports: ReportsToWrite,
    ) -> None:
        self._config = config
        # The replica: it wakes its own dispatch after a submit, so its NOTIFY is for the others.
        self._scheduler_id = scheduler_id
        # Tracing on: each task carries the submission's trace context (observe/tracing.py).
        self._tracing = tracing
        self._store = store
        self._dispatcher = dispatcher
        self._fixed = fixed
        self._planner = planner
        # Idle slots of this replica that a group's tasks are handed to as they are stored.
        self._handoff = handoff
        # Workers' reports that a group's insert writes in its commit.
        self._reports = reports
        # Concurrent single submissions of plain tasks, stored a group at a time.
        self._groups = SubmitGroups(self._store_group)

    def capacity(self, pool: str) -> int:
        """How many fixed-start reservations may overlap in the pool."""
        settings = self._config.pool(pool)
        return reservation_capacity(settings.max_workers, settings.reservable_fraction)

    def overload(self, tasks: Sequence[NewTask]) -> dict[str, Overload]:
        """The max_depth and overflow policy of each queue of the tasks that has one."""
        limits = {}
        for queue in {t.queue for t in tasks}:
            settings = self._config.queues.get(queue)
            if settings is not None and settings.max_depth is not None:
                held = self._dispatcher.holds.held_for(queue)
                limits[queue] = Overload(settings.max_depth, settings.overflow, held)
        return limits

    async def submit(
        self, tasks: Sequence[NewTask], submitted_by: str | None = None, stored: dict[int, TaskRow] | None = None
    ) -> list[Submitted]:
        """Stores the tasks (see store_tasks, also for `stored`) and wakes what should look at them now.
        A single plain task with `stored` (SubmitTask's) is stored with the others arriving
        meanwhile (scheduler_service.submit_groups)."""
        planned = self._planner.plan_submitted(with_trace_context(tasks) if self._tracing else tasks)
        overload = self.overload(planned)
        if stored is not None and len(planned) == 1 and groupable(planned[0]) and not overload:
            self._reports.submitted()
            one, row = await self._groups.submit(planned[0], submitted_by)
            stored[one.id] = row
            return [one]
        out = await store_tasks(
            self._store,
            planned,
            signal=self._dispatcher.holds.value,
            signals=self._dispatcher.holds.values_at_submit(planned),
            capacity=self.capacity,
            overload=overload,
            submitted_by=submitted_by,
            origin=self._scheduler_id,
            stored=stored,
        )
        self._dispatcher.wake_for({(t.queue, t.activity_type) for t in planned if t.fixed is None})
        if any(t.fixed for t in planned):
            self._fixed.refresh_now.set()
        return out

    async def _store_group(
        self, tasks: Sequence[NewTask], submitted_by: str | None
    ) -> tuple[list[Submitted], dict[int, TaskRow]]:
        """Stores a group of plain tasks (one insert, committed) with the workers' reports waiting
        to be written: those an idle slot of this replica may take at once are handed to it in
        that insert and sent; dispatch is woken for the others."""
        stored: dict[int, TaskRow] = {}
        sessions = self._handoff.reserve(tasks)
        try:
            out = await self._insert_with_reports(tasks, submitted_by, sessions, stored)
            try:
                await self._handoff.send(sessions, stored.values())
            except Exception:
                # Stored, so submitted: written again (a failed group is tried task by task) the
                # tasks would be stored twice. Those not sent are their workers' in the database
                # only, where the look for strays finds them (workers/strays.py).
                log.exception("submission.handoff_failed", extra={"tasks": len(stored)})
        finally:
            self._handoff.release(sessions)
        self._dispatcher.wake_for({(r.queue, r.activity_type) for r in stored.values() if r.state == "pending"})
        return out, stored

    async def _insert_with_reports(
        self,
        tasks: Sequence[NewTask],
        submitted_by: str | None,
        sessions: Sequence[WorkerSession | None],
        stored: dict[int, TaskRow],
    ) -> list[Submitted]:
        """The group's insert, committed with the reports lent meanwhile (one commit for both).
        An insert that fails otherwise than for the database being away is tried again alone
        (unless it committed and only its rows could not be read), so a report the database
        refuses never fails a submit; the reports go back to the completer,
        which writes those the insert did not."""
        key, reports = self._reports.lend()
        finished: dict[tuple[int, int], FinishedRow] = {}
        try:
            out = await self._insert(
                tasks, submitted_by=submitted_by, sessions=sessions, stored=stored, reports=reports, finished=finished
            )
        except BaseException as error:
            self._reports.give_back(key, None)
            # Tried again alone after any error but the database being away; a deadlock, timeout
            # or cancel the reports' finish met is not the submit's failure either.
            # Never one that committed (CommittedUnread): it would store the tasks twice.
            again = (
                isinstance(error, Exception)
                and not isinstance(error, CommittedUnread)
                and (not isinstance(error, DatabaseUnavailable) or statement_aborted(error))
            )
            if not (reports and again):
                raise
            return await self._insert(
                tasks, submitted_by=submitted_by, sessions=sessions, stored=stored, reports=(), finished=finished
            )
        self._reports.give_back(key, finished)
        return out

    async def _insert(
        self,
        tasks: Sequence[NewTask],
        *,
        submitted_by: str | None,
        sessions: Sequence[WorkerSession | None],
        stored: dict[int, TaskRow],
        reports: Sequence[tuple[Outcome, str | None]],
        finished: dict[tuple[int, int], FinishedRow],
    ) -> list[Submitted]:
        return await store_tasks(
            self._store,
            tasks,
            signal=self._dispatcher.holds.value,
            signals=self._dispatcher.holds.values_at_submit(tasks),
            submitted_by=submitted_by,
            origin=self._scheduler_id,
            stored=stored,
            workers=[None if s is None else s.worker_id for s in sessions],
            # PostgreSQL planned the insert anew on every execution (its custom plans look
            # cheaper than the generic one for a group of one): 0.5 ms of its CPU a group.
            planned=True,
            finishing=reports,
            finished=finished,
        )
