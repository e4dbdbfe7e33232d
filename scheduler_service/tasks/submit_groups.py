"""Group commit of single submissions: concurrent SubmitTask calls and SubmitStream submits
of plain tasks stored together.

Why it works this way: docs/architecture/tasks.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from lowtide.db import CommittedUnread
from lowtide.errors import DatabaseUnavailable
from scheduler_service.domain.model import NewTask
from scheduler_service.domain.submission import Submitted
from scheduler_service.rows.tasks import TaskRow

# Groups written at once. One: the next group gathers while one is written. Two (a second group
# written while the first waits for its commit) made groups smaller and statements more: the
# scheduler's loop, its bottleneck, busier, and at 1,000 single submits a second their p99 3-4x.
WRITERS = 1
# The most tasks one insert stores; the rest wait for the next group.
MAX_GROUP = 500
# The most payload one insert stores (the first task of a group always goes): a group is one JSON
# parameter (store/submissions.py, handed_group), its payloads in hex, and PostgreSQL takes no value
# of 1 GB or more. A task whose payload alone is over it is not grouped (Submission.submit).
MAX_GROUP_BYTES = 16 * 1024 * 1024

# Stores plain tasks of one submitter (see tasks/submission.py, store_tasks): each task's
# id, and the tasks as stored, by id.
Write = Callable[[Sequence[NewTask], str | None], Awaitable[tuple[list[Submitted], dict[int, TaskRow]]]]


@dataclass(frozen=True)
class _Waiting:
    task: NewTask
    answer: asyncio.Future[tuple[Submitted, TaskRow]]


class SubmitGroups:
    """Gathers single plain submissions per submitter and writes them in groups."""

    def __init__(self, write: Write) -> None:
        self._write = write
        # Per submitter (a task records who submitted it, one name per insert), in arrival order.
        self._waiting: dict[str | None, list[_Waiting]] = {}
        self._writers = 0
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, task: NewTask, submitted_by: str | None) -> tuple[Submitted, TaskRow]:
        """Stores the plain task with whatever else is waiting; its id and the task as stored,
        once committed."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[Submitted, TaskRow]] = loop.create_future()
        self._waiting.setdefault(submitted_by, []).append(_Waiting(task, answer))
        if self._writers < WRITERS:
            self._writers += 1
            writer = loop.create_task(self._drain(), name="submit-group")
            self._running.add(writer)
            writer.add_done_callback(self._running.discard)
        return await answer

    async def _drain(self) -> None:
        """Writes groups while any task waits."""
        try:
            while self._waiting:
                submitted_by = next(iter(self._waiting))
                waiting = self._waiting.pop(submitted_by)
                size = _group_size(waiting)
                if size < len(waiting):
                    self._waiting[submitted_by] = waiting[size:]
                    waiting = waiting[:size]
                await self._store(waiting, submitted_by)
        finally:
            self._writers -= 1

    async def _store(self, group: list[_Waiting], submitted_by: str | None) -> None:
        # A caller gone (cancelled, its deadline passed) before the write was never answered:
        # its task is not stored.
        group = [w for w in group if not w.answer.done()]
        if not group:
            return
        try:
            out, rows = await self._write([w.task for w in group], submitted_by)
        except (DatabaseUnavailable, CommittedUnread) as error:
            # Away, or stored but unread: written again, each alone, the tasks would be twice.
            _fail(group, error)
            return
        except Exception as error:
            if len(group) == 1:
                _fail(group, error)
                return
            # One task the database refuses must not fail the others: each is written alone.
            for waiting in group:
                await self._store([waiting], submitted_by)
            return
        except BaseException:
            _fail(group, DatabaseUnavailable("the scheduler stopped before the task was stored"))
            raise
        for waiting, submitted in zip(group, out, strict=True):
            if not waiting.answer.done():
                waiting.answer.set_result((submitted, rows[submitted.id]))


def _group_size(waiting: list[_Waiting]) -> int:
    """How many of the first waiting tasks the next group takes: at most MAX_GROUP, and no more
    payload than MAX_GROUP_BYTES but for its first task."""
    payload = 0
    for size, waiting_task in enumerate(waiting[:MAX_GROUP]):
        payload += len(waiting_task.task.payload)
        if size and payload > MAX_GROUP_BYTES:
            return size
    return min(len(waiting), MAX_GROUP)


def _fail(group: list[_Waiting], error: BaseException) -> None:
    for waiting in group:
        if not waiting.answer.done():
            waiting.answer.set_exception(error)
