"""The submit side: an asyncio client for ``lowtide.v1.SchedulerService``.

Errors are not wrapped: a failed call raises the ``grpc.aio.AioRpcError`` it got, so the
status code and details the scheduler chose reach the caller unchanged, and code that
already handles gRPC errors needs nothing new.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Generic, TypeVar, Unpack, overload

import grpc

from lowtide_client import _codec
from lowtide_client._calls import Calls
from lowtide_client._spec import TaskOptions, _duration, _miss_policy, task_spec
from lowtide_client._submit_stream import SubmitStream
from lowtide_client._typed import TaskNotCompleted, activity_name, encode_payload, result_type
from lowtide_proto.channel import Security
from lowtide_proto.durations import duration_to_proto
from lowtide_proto.lowtide.v1 import schedule_pb2, scheduler_pb2, task_pb2

__all__ = ["FINISHED_STATES", "Client", "Submitted"]

#: States a task never leaves.
FINISHED_STATES: frozenset[task_pb2.TaskState.ValueType] = frozenset(
    {
        task_pb2.TASK_STATE_COMPLETED,
        task_pb2.TASK_STATE_FAILED,
        task_pb2.TASK_STATE_CANCELLED,
        task_pb2.TASK_STATE_TIMED_OUT,
        task_pb2.TASK_STATE_SKIPPED,
        task_pb2.TASK_STATE_SHED,
    }
)

# The dependencies one SubmitTasks may name in all (the scheduler refuses more with RESOURCE_EXHAUSTED).
MAX_BATCH_DEPENDENCIES = 100_000
# WaitTask holds the call open on the server; one call waits at most this long (the server
# allows 5 minutes, but shorter slices survive proxies with idle timeouts).
_WAIT_SLICE = timedelta(seconds=60)
# The gRPC deadline of a WaitTask call is its wait plus this margin, so that a scheduler that
# vanished without closing the connection cannot hang wait() forever.
_WAIT_MARGIN = 10.0

_T = TypeVar("_T")
_R = TypeVar("_R")


class Client:
    """Submit, inspect, cancel and wait for tasks.

    ``Client("host:port")`` opens a channel (plaintext, or TLS with ``ca=``) lazily (on the
    first call, inside the running event loop, which ``grpc.aio`` requires) and closes it in
    ``close()``; ``token=`` is sent as a bearer token on every call. Pass
    ``channel=`` to use your own (TLS, interceptors, options); the client then never closes
    it, because whoever made it may share it.

    Use it as ``async with Client(...) as client:`` or call ``await client.close()``.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
        ca: str | bytes | None = None,
        cert: str | bytes | None = None,
        key: str | bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        # token: sent as `authorization: Bearer` (auth on); ca, or cert and key for mutual TLS,
        # or credentials: TLS. Ignored when you pass your own channel.
        security = Security(token=token, ca=ca, cert=cert, key=key, credentials=credentials)
        self._calls = Calls(target, security, channel)
        # submit()'s: one stream for the whole client (_submit_stream.py).
        self._submits = SubmitStream(self._calls)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel if this client opened it. Safe to call more than once."""
        await self._submits.close()
        await self._calls.close()

    @overload
    async def submit(
        self, activity_type: str, payload: bytes | str = b"", **options: Unpack[TaskOptions]
    ) -> task_pb2.Task: ...

    @overload
    async def submit(  # an async fn matches the next overload too; this one comes first
        self, activity_type: Callable[[_T], Awaitable[_R]], payload: _T, **options: Unpack[TaskOptions]
    ) -> Submitted[_R]: ...

    @overload
    async def submit(
        self, activity_type: Callable[[_T], _R], payload: _T, **options: Unpack[TaskOptions]
    ) -> Submitted[_R]: ...

    async def submit(
        self, activity_type: str | Callable[[Any], Any], payload: Any = b"", **options: Unpack[TaskOptions]
    ) -> task_pb2.Task | Submitted[Any]:
        """Submit one task and return it as stored.

        Typed: ``await client.submit(train, Params(...))`` names the activity by the function
        (the name it was registered under in this process, else its ``__name__``), encodes
        the value as JSON with the header ``content-type: application/json`` (bytes pass as
        they are), and returns a ``Submitted`` whose ``await .result()`` is the task's result
        decoded as the function's return annotation says. A type checker checks the value
        against the function's parameter.

        By name: ``submit("resize", b"...")`` sends the payload bytes as they are (a ``str``
        UTF-8 encoded) and returns the stored task. The options are those of ``task_spec``
        (``TaskOptions``). With an ``idempotency_key`` that names an existing task, that
        task is returned instead of a new one.
        """
        if isinstance(activity_type, str):
            return await self._submit_spec(task_spec(activity_type, payload, **options))
        data, headers = encode_payload(payload, options.get("headers"))
        options["headers"] = headers
        task = await self._submit_spec(task_spec(activity_name(activity_type), data, **options))
        return Submitted(task=task, client=self, returns=result_type(activity_type))

    async def _submit_spec(self, spec: task_pb2.TaskSpec) -> task_pb2.Task:
        return (await self._submits.submit(spec)).task

    async def submit_many(
        self, specs: Iterable[task_pb2.TaskSpec], *, batch_size: int = 1000
    ) -> builtins.list[scheduler_pb2.SubmittedTask]:
        """Submit many tasks, ``batch_size`` per ``SubmitTasks`` call (fewer when the batch would
        name over 100,000 dependencies in all); one entry per spec, in order.

        Batching keeps each request well under gRPC's message size limit and bounds the
        scheduler's transaction. Each batch is all or nothing, but the batches are separate:
        when one fails, the earlier ones stay submitted. Give the specs idempotency keys to
        make resubmitting everything after such a failure safe.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        submitted: builtins.list[scheduler_pb2.SubmittedTask] = []

        async def send(batch: builtins.list[task_pb2.TaskSpec]) -> None:
            response: scheduler_pb2.SubmitTasksResponse = await self._calls.call(
                "SubmitTasks", scheduler_pb2.SubmitTasksRequest(tasks=batch)
            )
            submitted.extend(response.tasks)

        # A batch also ends before it would name more dependencies in all than the scheduler takes.
        batch: builtins.list[task_pb2.TaskSpec] = []
        named = 0
        for spec in specs:
            if batch and (len(batch) == batch_size or named + len(spec.depends_on) > MAX_BATCH_DEPENDENCIES):
                await send(batch)
                batch, named = [], 0
            batch.append(spec)
            named += len(spec.depends_on)
        if batch:
            await send(batch)
        return submitted

    async def get(self, task_id: int) -> task_pb2.Task:
        """Return the task with this id (NOT_FOUND when there is none)."""
        response: scheduler_pb2.GetTaskResponse = await self._calls.call(
            "GetTask", scheduler_pb2.GetTaskRequest(id=task_id)
        )
        return response.task

    async def cancel(self, task_id: int) -> task_pb2.Task:
        """Cancel a task: a pending one ends at once, a running one's worker is told to stop."""
        response: scheduler_pb2.CancelTaskResponse = await self._calls.call(
            "CancelTask", scheduler_pb2.CancelTaskRequest(id=task_id)
        )
        return response.task

    async def retry(self, task_id: int, *, if_attempt: int | None = None) -> task_pb2.Task:
        """Run a task that failed, timed out, was cancelled or shed again: it is pending and due
        at once, with one more attempt if it had used all of its own (FAILED_PRECONDITION for a
        task that completed, still runs or waits, or is a fixed start).

        ``if_attempt``: the attempt you saw it end at (its ``attempt``, 0 if it never ran). With
        it, the same call made again once the task has moved on (resent after UNAVAILABLE, whose
        first try may have been carried out) answers the task as it is instead of failing."""
        request = scheduler_pb2.RetryTaskRequest(id=task_id, if_attempt=if_attempt)
        response: scheduler_pb2.RetryTaskResponse = await self._calls.call("RetryTask", request)
        return response.task

    async def list(
        self,
        *,
        queue: str = "",
        state: task_pb2.TaskState.ValueType | int = task_pb2.TASK_STATE_UNSPECIFIED,
        activity_type: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> scheduler_pb2.ListTasksResponse:
        """List one page of tasks, newest first; empty filters match everything.

        Pass the response's ``next_page_token`` back as ``page_token`` for the next page
        (it is empty on the last one). Listed tasks carry no payload or result.
        """
        request = scheduler_pb2.ListTasksRequest(
            queue=queue,
            state=task_pb2.TaskState.ValueType(state),
            activity_type=activity_type,
            page_size=page_size,
            page_token=page_token,
        )
        response: scheduler_pb2.ListTasksResponse = await self._calls.call("ListTasks", request)
        return response

    async def explain(self, task_id: int) -> scheduler_pb2.ExplainTaskResponse:
        """Why is it pending? The task, a sentence, and the reasons as short codes."""
        response: scheduler_pb2.ExplainTaskResponse = await self._calls.call(
            "ExplainTask", scheduler_pb2.ExplainTaskRequest(id=task_id)
        )
        return response

    async def pause_queue(self, queue: str, *, create: bool = False) -> scheduler_pb2.QueueStatus:
        """No worker claims from a paused queue, and its schedule_to_start timers stop. A queue
        nobody has used is refused (NOT_FOUND, naming the closest known queue) unless `create`:
        then it is created paused."""
        response: scheduler_pb2.PauseQueueResponse = await self._calls.call(
            "PauseQueue", scheduler_pb2.PauseQueueRequest(queue=queue, create=create)
        )
        return response.queue

    async def resume_queue(self, queue: str) -> scheduler_pb2.QueueStatus:
        response: scheduler_pb2.ResumeQueueResponse = await self._calls.call(
            "ResumeQueue", scheduler_pb2.ResumeQueueRequest(queue=queue)
        )
        return response.queue

    async def status(self) -> scheduler_pb2.GetStatusResponse:
        """Queues (claimable and held apart), pools, the cost hold and carbon accounting."""
        response: scheduler_pb2.GetStatusResponse = await self._calls.call(
            "GetStatus", scheduler_pb2.GetStatusRequest()
        )
        return response

    # The timeout is part of the request (the scheduler does the waiting), hence the noqa.
    async def wait(self, task_id: int, *, timeout: timedelta = timedelta(seconds=30)) -> task_pb2.Task:  # noqa: ASYNC109
        """Wait until the task is finished or ``timeout`` has passed; return it as it is then.

        The scheduler holds each ``WaitTask`` call open until the task finishes, so this
        costs one call per minute of waiting rather than a polling loop. A timeout of zero
        (or less) just fetches the task. Check ``task.state`` (or ``FINISHED_STATES``) to
        tell a finished task from a timeout.
        """
        deadline = time.monotonic() + timeout.total_seconds()
        if timeout <= timedelta(0):
            return await self.get(task_id)
        while True:
            remaining = timedelta(seconds=deadline - time.monotonic())
            wait_for = min(remaining, _WAIT_SLICE)
            # Time passes between the check below and here; never ask for a zero or negative
            # wait, which the scheduler could take for "unset" (30 s) or refuse.
            wait_for = max(wait_for, timedelta(milliseconds=1))
            response: scheduler_pb2.WaitTaskResponse = await self._calls.call(
                "WaitTask",
                scheduler_pb2.WaitTaskRequest(id=task_id, timeout=duration_to_proto(wait_for)),
                rpc_timeout=wait_for.total_seconds() + _WAIT_MARGIN,
            )
            if response.finished or response.task.state in FINISHED_STATES:
                return response.task
            if time.monotonic() >= deadline:
                return response.task

    async def create_schedule(
        self,
        name: str,
        cron: str,
        activity_type: str,
        payload: bytes | str = b"",
        *,
        time_zone: str = "UTC",
        queue: str = "default",
        pool: str = "",
        priority: int = 0,
        start_tolerance: timedelta | None = None,
        on_miss: str | task_pb2.MissPolicy.ValueType = task_pb2.MISS_POLICY_UNSPECIFIED,
        estimated_duration: timedelta | None = None,
    ) -> schedule_pb2.Schedule:
        """Create a recurring schedule: at each fire time of ``cron`` (five fields) in
        ``time_zone`` the scheduler creates a fixed-start task of ``activity_type``, admitted
        against the pool's reservations like any other. An occurrence that does not fit is
        skipped and recorded on the schedule (``last_conflict``)."""
        spec = schedule_pb2.ScheduleSpec(
            name=name,
            cron=cron,
            time_zone=time_zone,
            activity_type=activity_type,
            queue=queue,
            pool=pool,
            payload=payload.encode() if isinstance(payload, str) else bytes(payload),
            priority=priority,
        )
        # The same checks and names as a task's fixed start (``task_spec``).
        spec.on_miss = _miss_policy(on_miss)
        if start_tolerance is not None:
            spec.start_tolerance.CopyFrom(_duration("start_tolerance", start_tolerance))
        if estimated_duration is not None:
            spec.estimated_duration.CopyFrom(_duration("estimated_duration", estimated_duration))
        response: schedule_pb2.CreateScheduleResponse = await self._calls.call(
            "CreateSchedule", schedule_pb2.CreateScheduleRequest(schedule=spec)
        )
        return response.schedule

    async def list_schedules(self) -> builtins.list[schedule_pb2.Schedule]:
        """Every schedule, by name."""
        response: schedule_pb2.ListSchedulesResponse = await self._calls.call(
            "ListSchedules", schedule_pb2.ListSchedulesRequest()
        )
        return builtins.list(response.schedules)

    async def pause_schedule(self, name: str) -> schedule_pb2.PauseScheduleResponse:
        """Stop a schedule creating tasks; the tasks it created whose start is still ahead are
        cancelled (their ids are in the response)."""
        response: schedule_pb2.PauseScheduleResponse = await self._calls.call(
            "PauseSchedule", schedule_pb2.PauseScheduleRequest(name=name)
        )
        return response

    async def resume_schedule(self, name: str) -> schedule_pb2.Schedule:
        """Resume a paused schedule from its next fire time after now."""
        response: schedule_pb2.ResumeScheduleResponse = await self._calls.call(
            "ResumeSchedule", schedule_pb2.ResumeScheduleRequest(name=name)
        )
        return response.schedule

    async def delete_schedule(self, name: str) -> schedule_pb2.DeleteScheduleResponse:
        """Delete a schedule; the tasks it created whose start is still ahead are cancelled."""
        response: schedule_pb2.DeleteScheduleResponse = await self._calls.call(
            "DeleteSchedule", schedule_pb2.DeleteScheduleRequest(name=name)
        )
        return response


RESERVATION_CONFLICT_KEY = "lowtide-reservation-conflict-bin"


def reservation_conflict(error: grpc.aio.AioRpcError) -> task_pb2.ReservationConflict | None:
    """The details of a refused fixed start (pool, capacity, windows, conflicting tasks), or None
    when the error is something else."""
    for key, value in error.trailing_metadata() or ():
        if key == RESERVATION_CONFLICT_KEY and isinstance(value, bytes):
            return task_pb2.ReservationConflict.FromString(value)
    return None


@dataclass(frozen=True, slots=True)
class Submitted(Generic[_R]):
    """A task submitted with ``Client.submit(fn, value)``; ``result()`` waits for its decoded result."""

    task: task_pb2.Task
    client: Client
    returns: Any

    @property
    def id(self) -> int:
        return self.task.id

    # The timeout is part of the WaitTask request (the scheduler waits), hence the noqa.
    async def result(self, *, timeout: timedelta = timedelta(seconds=30)) -> _R:  # noqa: ASYNC109
        """Wait for the task and return its result decoded as ``fn``'s return annotation says;
        ``TaskNotCompleted`` when it ended otherwise or the wait ran out."""
        task = await self.client.wait(self.task.id, timeout=timeout)
        if task.state != task_pb2.TASK_STATE_COMPLETED:
            raise TaskNotCompleted(task)
        value: _R = _codec.decode(task.result, self.returns)
        return value
