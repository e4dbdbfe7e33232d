"""SchedulerService: submit, get, cancel, list and wait. Thin: proto in, a call, proto out.

Submissions go through tasks/submission.py (planning, admission, overload); reading,
cancelling and explaining a task through tasks/control.py; the rest through the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from lowtide import errors
from lowtide.auth import caller
from lowtide.config import Config, TokenEntry
from lowtide.errors import InvalidArgument, TooLarge
from lowtide.grpc_status import handles_errors
from lowtide_proto.lowtide.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from scheduler_service.api.schedules import ScheduleApi
from scheduler_service.api.submit_stream import serve_submit_stream
from scheduler_service.dispatch.adaptive import adaptive_status
from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.domain.fixed import Refused
from scheduler_service.domain.model import NewTask
from scheduler_service.domain.submission import Submitted
from scheduler_service.fleet.sessions import Registry
from scheduler_service.observe.status import carbon_statuses, hold_status, queue_statuses
from scheduler_service.observe.tracing import TaskTraces
from scheduler_service.rows.fleet import PendingGroup
from scheduler_service.rows.tasks import TaskRow
from scheduler_service.store import Store
from scheduler_service.tasks.control import TaskControl
from scheduler_service.tasks.submission import Submission
from scheduler_service.tasks.waiters import Waiters
from scheduler_service.wire import inbound, outbound

if TYPE_CHECKING:
    from scheduler_service.observe.metrics import SchedulerMetrics

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

MAX_PAGE = 1000
# The most task ids one page of a listing filtered by queue or activity type looks among.
FILTER_WINDOW = 100_000
# Tokens are task ids this service handed out: plain ASCII digits that fit a bigint.
_PAGE_TOKEN = re.compile(r"[0-9]{1,18}")
MAX_WAIT = timedelta(minutes=5)
FINISHED = {"completed", "failed", "cancelled", "timed_out", "skipped", "shed"}


class SchedulerApi(ScheduleApi, scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(
        self,
        *,
        config: Config,
        store: Store,
        registry: Registry,
        dispatcher: Dispatcher,
        metrics: SchedulerMetrics,
        submission: Submission,
        tasks: TaskControl,
        waiters: Waiters,
        traces: TaskTraces | None = None,
    ) -> None:
        self._config = config
        self._traces = traces
        self._store = store
        self._registry = registry
        self._dispatcher = dispatcher
        self.submission = submission
        self._tasks = tasks
        self._waiters = waiters
        self.metrics = metrics

    def _validate(self, spec: Any) -> Any:
        return inbound.new_task(
            spec,
            defaults=self._config.retry,
            max_payload=self._config.scheduler.max_payload_bytes,
            type_defaults=self._config.types,
            resources=self._config.resources,
            pools=self._config.pools,
        )

    def _who(self, context: Context) -> TokenEntry | None:
        return caller(self._config.auth, context.invocation_metadata() or ())

    def submitter(self, context: Context) -> str | None:
        """The name tasks submitted on this call are stored under (None: auth off)."""
        who = self._who(context)
        return who.name if who else None

    async def _submit(
        self, tasks: list[NewTask], submitter: str | None, stored: dict[int, TaskRow] | None = None
    ) -> list[Submitted]:
        try:
            return await self.submission.submit(tasks, submitter, stored)
        except Refused as refused:
            raise conflict_error(refused, len(tasks) > 1) from None

    @handles_errors
    async def SubmitTask(
        self, request: scheduler_pb2.SubmitTaskRequest, context: Context
    ) -> scheduler_pb2.SubmitTaskResponse:
        if not request.HasField("task"):
            raise InvalidArgument("task", "is required")
        return await self.submit_one(request.task, self.submitter(context))

    async def submit_one(self, spec: task_pb2.TaskSpec, submitter: str | None) -> scheduler_pb2.SubmitTaskResponse:
        """One task submitted (SubmitTask, and each submit of a SubmitStream)."""
        try:
            task = self._validate(spec)
        except InvalidArgument as error:
            # A re-submit (an answer lost, sent again) may come once its deadline or start has
            # passed: the task stored under its key is the answer, not a refusal as a new task.
            found = await self._stored_before([spec], submitter) if _keyed(error) else []
            row = await self._store.get_task(found[0]) if found and found[0] is not None else None
            if row is None:
                raise
            return scheduler_pb2.SubmitTaskResponse(task=outbound.task_message(row), created=False)
        # A plain task comes back from its insert whole; one the submitter stored before under
        # its idempotency key, or one stored with more than an insert, is read back.
        stored: dict[int, TaskRow] = {}
        [submitted] = await self._submit([task], submitter, stored)
        row = stored.get(submitted.id) or await self._store.get_task(submitted.id)
        assert row is not None
        return scheduler_pb2.SubmitTaskResponse(task=outbound.task_message(row), created=submitted.created)

    async def SubmitStream(  # type: ignore[override]  # answers written with context.write
        self, requests: AsyncIterator[scheduler_pb2.SubmitStreamRequest], context: Context
    ) -> None:
        await serve_submit_stream(self.submit_one, self.submitter(context), self._traces, requests, context)

    @handles_errors
    async def SubmitTasks(
        self, request: scheduler_pb2.SubmitTasksRequest, context: Context
    ) -> scheduler_pb2.SubmitTasksResponse:
        limit = self._config.scheduler.max_batch_tasks
        if len(request.tasks) > limit:
            raise TooLarge(f"tasks: {len(request.tasks)} tasks is over the limit of {limit} per batch")
        named, most = sum(len(spec.depends_on) for spec in request.tasks), inbound.MAX_BATCH_DEPENDENCIES
        if named > most:
            raise TooLarge(f"tasks: {named:,} dependencies in all is over the limit of {most:,} per batch")
        tasks: list[NewTask] = []
        refused: dict[int, InvalidArgument] = {}
        for index, spec in enumerate(request.tasks):
            try:
                tasks.append(self._validate(spec))
            except InvalidArgument as error:
                if not spec.idempotency_key or not _keyed(error):
                    raise InvalidArgument(f"tasks[{index}].{error.field}", str(error).split(": ", 1)[1]) from None
                refused[index] = error
            except TooLarge as error:
                raise TooLarge(f"tasks[{index}].{error}") from None
        # A spec refused as a new task whose key names a stored one is a re-submit: that task is
        # its answer (as in SubmitTask), found for all of them in one read.
        answered: dict[int, int] = {}
        if refused:
            stored = await self._stored_before([request.tasks[i] for i in refused], self.submitter(context))
            for (index, refusal), before in zip(refused.items(), stored, strict=True):
                if before is None:
                    raise InvalidArgument(f"tasks[{index}].{refusal.field}", str(refusal).split(": ", 1)[1]) from None
                answered[index] = before
        submitted = iter(await self._submit(tasks, self.submitter(context)) if tasks else [])
        entries = []
        for index in range(len(request.tasks)):
            if index in answered:
                entries.append(scheduler_pb2.SubmittedTask(id=answered[index], created=False))
            else:
                new = next(submitted)
                entries.append(scheduler_pb2.SubmittedTask(id=new.id, created=new.created))
        return scheduler_pb2.SubmitTasksResponse(tasks=entries)

    async def _stored_before(self, specs: list[Any], submitter: str | None) -> list[int | None]:
        """For each spec with an idempotency key, the id of the task its submitter stored under it
        before, else None; [] when no spec has a key."""
        keys = [spec.idempotency_key for spec in specs if spec.idempotency_key]
        if not keys:
            return []
        stored = await self._store.stored_under_keys(keys, submitter)
        return [stored.get(spec.idempotency_key) if spec.idempotency_key else None for spec in specs]

    @handles_errors
    async def GetTask(self, request: scheduler_pb2.GetTaskRequest, context: Context) -> scheduler_pb2.GetTaskResponse:
        return scheduler_pb2.GetTaskResponse(task=outbound.task_message(await self._tasks.get(request.id)))

    @handles_errors
    async def CancelTask(
        self, request: scheduler_pb2.CancelTaskRequest, context: Context
    ) -> scheduler_pb2.CancelTaskResponse:
        row = await self._tasks.cancel(request.id, self._who(context))
        self._waiters.finished([row.id])
        return scheduler_pb2.CancelTaskResponse(task=outbound.task_message(row))

    @handles_errors
    async def RetryTask(
        self, request: scheduler_pb2.RetryTaskRequest, context: Context
    ) -> scheduler_pb2.RetryTaskResponse:
        if_attempt = request.if_attempt if request.HasField("if_attempt") else None
        row = await self._tasks.retry(request.id, self._who(context), if_attempt)
        return scheduler_pb2.RetryTaskResponse(task=outbound.task_message(row))

    @handles_errors
    async def ListTasks(
        self, request: scheduler_pb2.ListTasksRequest, context: Context
    ) -> scheduler_pb2.ListTasksResponse:
        if request.page_size > MAX_PAGE:
            raise InvalidArgument("page_size", f"must be at most {MAX_PAGE}")
        before_id = None
        if request.page_token:
            if not _PAGE_TOKEN.fullmatch(request.page_token):
                raise InvalidArgument("page_token", "is not a token this service gave out")
            before_id = int(request.page_token)
        size = request.page_size or 100
        queue = inbound.optional_name("queue", request.queue)
        activity_type = inbound.optional_name("activity_type", request.activity_type)
        # No index finds a queue's or a type's tasks newest first, so a page filtered by either
        # looks among the next FILTER_WINDOW ids only, and says where to go on when it found
        # fewer: a rare queue in a table of millions costs many short pages, each a bounded read,
        # not one read of the whole table.
        from_id = None
        if queue is not None or activity_type is not None:
            top = before_id if before_id is not None else await self._store.next_task_id()
            from_id = max(1, top - FILTER_WINDOW)
        rows = await self._store.list_tasks(
            queue=queue,
            state=inbound.state_filter(request.state),
            activity_type=activity_type,
            before_id=before_id,
            from_id=from_id,
            limit=size + 1,
        )
        more = len(rows) > size
        rows = rows[:size]
        token = str(rows[-1].id) if more else ""
        if not more and from_id is not None and from_id > 1:
            token = str(from_id)
        return scheduler_pb2.ListTasksResponse(tasks=[outbound.task_message(r) for r in rows], next_page_token=token)

    @handles_errors
    async def WaitTask(
        self, request: scheduler_pb2.WaitTaskRequest, context: Context
    ) -> scheduler_pb2.WaitTaskResponse:
        timeout = timedelta(seconds=30)
        if request.HasField("timeout"):
            timeout = inbound.duration("timeout", request.timeout)
        if timeout > MAX_WAIT:
            raise InvalidArgument("timeout", "must be at most 5m")
        with self._waiters.waiter(request.id) as finished:
            row = await self._tasks.get(request.id)
            if row.state not in FINISHED:
                # Resolved by whatever finishes the task (see waiters.py); no polling here.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(finished), timeout.total_seconds())
                row = await self._tasks.get(request.id)
        return scheduler_pb2.WaitTaskResponse(task=outbound.task_message(row), finished=row.state in FINISHED)

    @handles_errors
    async def ExplainTask(
        self, request: scheduler_pb2.ExplainTaskRequest, context: Context
    ) -> scheduler_pb2.ExplainTaskResponse:
        row, text, codes = await self._tasks.explain(request.id)
        return scheduler_pb2.ExplainTaskResponse(task=outbound.task_message(row), explanation=text, reasons=codes)

    @handles_errors
    async def PauseQueue(
        self, request: scheduler_pb2.PauseQueueRequest, context: Context
    ) -> scheduler_pb2.PauseQueueResponse:
        name = inbound.name("queue", request.queue)
        if not request.create:
            await self._known_queue(name, "pause")
        await self._store.pause_queue(name)
        return scheduler_pb2.PauseQueueResponse(queue=await self._queue_status(name))

    @handles_errors
    async def ResumeQueue(
        self, request: scheduler_pb2.ResumeQueueRequest, context: Context
    ) -> scheduler_pb2.ResumeQueueResponse:
        name = inbound.name("queue", request.queue)
        await self._known_queue(name, "resume")
        await self._store.resume_queue(name)
        self._registry.wake_all()
        return scheduler_pb2.ResumeQueueResponse(queue=await self._queue_status(name))

    async def _known_queue(self, name: str, verb: str) -> None:
        """NotFound, with the closest known name, for a queue nobody has used: a typo must not
        leave a paused queue behind that no task will ever go to."""
        known = await self._store.known_queues() | set(self._config.queues) | {"default"}
        if name in known:
            return
        closest = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean {closest[0]!r}? " if closest else ""
        create = " (or create it paused: lowtide queue pause --create)" if verb == "pause" else ""
        raise errors.NotFound(
            f"queue {name!r}: no task was ever submitted to it and no worker serves it; {hint}"
            f"name a known queue{create}"
        )

    async def _queue_status(self, name: str) -> scheduler_pb2.QueueStatus:
        for queue in await self._queues():
            if queue.name == name:
                return queue
        return scheduler_pb2.QueueStatus(name=name)  # pragma: no cover - _queues lists paused queues

    async def _queues(
        self, pending: list[PendingGroup] | None = None, running: dict[str, int] | None = None
    ) -> list[scheduler_pb2.QueueStatus]:
        paused = await self._store.paused_queues()
        if pending is None or running is None:
            pending, running = await self._store.pending_by_queue_and_type(), await self._store.running_by_queue()
        return queue_statuses(self._dispatcher.holds, paused, pending, running, self._config.queues)

    @handles_errors
    async def GetStatus(
        self, request: scheduler_pb2.GetStatusRequest, context: Context
    ) -> scheduler_pb2.GetStatusResponse:
        holds = self._dispatcher.holds
        every = [
            hold_status(self._config, name, hold, holds.types_following(name)) for name, hold in holds.by_signal.items()
        ]
        hold = next(h for h in every if h.signal == holds.default)
        # One read of the backlog serves the queues and the pools.
        pending, running = await self._store.pending_by_queue_and_type(), await self._store.running_by_queue()
        pools = await self.metrics.pool_status(pending, running)
        deferrable = sorted(holds.config.deferrable.union(*(holds.config.per_queue or {}).values()))
        totals = await self._dispatcher.carbon.of(deferrable) if deferrable else {}
        carbon = carbon_statuses(totals)
        queues = await self._queues(pending, running)
        adaptive = await adaptive_status(self._dispatcher.adaptive, self._store)
        return scheduler_pb2.GetStatusResponse(
            queues=queues, pools=pools, hold=hold, carbon=carbon, adaptive_limits=adaptive, holds=every
        )


def conflict_error(refused: Refused, batch: bool) -> errors.ReservationConflict:
    """The gRPC error for a refused fixed start: FAILED_PRECONDITION, a message that names the
    pool, the capacity and the windows, and the same as a ReservationConflict in the trailers."""
    conflict = refused.conflict
    details = task_pb2.ReservationConflict(
        pool=refused.pool, capacity=conflict.capacity, conflicting_task_ids=list(conflict.task_ids)
    )
    details.window_start.FromDatetime(conflict.window.start)
    details.window_end.FromDatetime(conflict.window.end)
    details.conflict_start.FromDatetime(conflict.conflict.start)
    details.conflict_end.FromDatetime(conflict.conflict.end)
    where = f"tasks[{refused.index}]: " if batch else ""
    message = (
        f"{where}reservation conflict in pool {refused.pool}: at most {conflict.capacity} reservation(s) may "
        f"overlap, and {len(conflict.task_ids)} already do from {conflict.conflict.start.isoformat()} to "
        f"{conflict.conflict.end.isoformat()} (requested window {conflict.window.start.isoformat()} to "
        f"{conflict.window.end.isoformat()}; conflicting tasks {', '.join(map(str, conflict.task_ids))})"
    )
    return errors.ReservationConflict(message, details.SerializeToString())


def _keyed(refusal: InvalidArgument) -> bool:
    """Whether a refused spec may still name a stored task by its key: not when the key itself
    is what was refused (a NUL, too long), which no lookup could take. inbound.new_task checks
    the key before any other field, so a refusal of another field means the key is good."""
    return refusal.field != "idempotency_key"
