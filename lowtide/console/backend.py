"""What the console asks the services, through their public gRPC APIs only (it never reads the
database): one channel to each service for the whole process, and the visitor's token sent as
call metadata on each call, so every call is made with that visitor's own role."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from lowtide_proto.channel import Security, open_channel
from lowtide_proto.lowtide.v1 import (
    scheduler_pb2,
    scheduler_pb2_grpc,
    signal_pb2,
    signal_pb2_grpc,
    task_pb2,
)

# Every call the console makes ends within this many seconds: a page never hangs on a service.
CALL_TIMEOUT = 5.0
# The signals besides the default one drawn on the overview, each with its own chart.
MAX_OTHER_SIGNALS = 8
# The signal's history drawn on the overview.
HISTORY = timedelta(hours=48)
# Pending tasks read for planned releases and reservations (one page; ListTasks allows 1000).
PENDING_PAGE = 1000
# Newest completed tasks read to estimate tasks per second, over this window.
RATE_PAGE = 500
RATE_WINDOW = 30.0
# Status samples kept for the depth-over-time charts (one per refresh, ~1 h at 3 s).
SAMPLES = 1200


@dataclass(frozen=True)
class QueueSample:
    at: float
    depth: int
    held: int
    running: int


@dataclass(frozen=True)
class SignalView:
    """A signal other than the default one, with what its chart draws."""

    signal: signal_pb2.SignalState
    history: list[signal_pb2.SignalPoint]
    forecast: list[signal_pb2.SignalPoint]


@dataclass(frozen=True)
class Overview:
    status: scheduler_pb2.GetStatusResponse
    signal: signal_pb2.SignalState
    history: list[signal_pb2.SignalPoint]
    forecast: list[signal_pb2.SignalPoint]
    pending: list[task_pb2.Task]
    tasks_per_second: float
    samples: dict[str, list[QueueSample]]
    now: datetime
    # Every other signal the signal service keeps (a price, another grid zone), by name.
    others: list[SignalView] = field(default_factory=list)
    # When the forecast was issued (Unix seconds; None before the first), and by which feed.
    forecast_issued_at: float | None = None
    forecast_source: str = ""


@dataclass(frozen=True)
class TaskStory:
    task: task_pb2.Task
    explanation: str
    reasons: list[str]
    forecast: list[signal_pb2.SignalPoint]
    threshold: float
    # The signal the plan was made on: the pool's, when it placed the task in a pool bound to one.
    signal: str = ""


@dataclass
class Samples:
    """Depth, held and running per queue as the console saw them: no RPC keeps their history,
    so the charts show what was sampled since the console started (one sample per refresh)."""

    by_queue: dict[str, deque[QueueSample]] = field(default_factory=dict)

    def add(self, status: scheduler_pb2.GetStatusResponse, at: float) -> None:
        for queue in status.queues[:50]:
            kept = self.by_queue.setdefault(queue.name, deque(maxlen=SAMPLES))
            if kept and at - kept[-1].at < 1.0:
                continue
            kept.append(QueueSample(at, queue.depth, queue.held_depth, queue.running))

    def snapshot(self) -> dict[str, list[QueueSample]]:
        return {name: list(kept) for name, kept in self.by_queue.items()}


class Backend:
    """The two services, as the console reaches them."""

    def __init__(self, scheduler_target: str, signal_target: str, security: Security) -> None:
        self.scheduler_target = scheduler_target
        self.signal_target = signal_target
        # TLS only (`security` carries no token): each call carries the visitor's own.
        self._security = security
        self._channels: list[grpc.aio.Channel] = []
        self._scheduler: Any = None
        self._signal: Any = None
        self.samples = Samples()

    def _stubs(self) -> tuple[Any, Any]:
        if self._scheduler is None:
            scheduler = open_channel(self.scheduler_target, self._security)
            signal = open_channel(self.signal_target, self._security)
            self._channels = [scheduler, signal]
            self._scheduler = scheduler_pb2_grpc.SchedulerServiceStub(scheduler)
            self._signal = signal_pb2_grpc.SignalServiceStub(signal)
        return self._scheduler, self._signal

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels, self._scheduler, self._signal = [], None, None

    async def _call(self, service: str, method: str, request: Any, token: str | None) -> Any:
        scheduler, signal = self._stubs()
        stub = scheduler if service == "scheduler" else signal
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        return await getattr(stub, method)(request, metadata=metadata, timeout=CALL_TIMEOUT)

    async def status(self, token: str | None) -> scheduler_pb2.GetStatusResponse:
        response: scheduler_pb2.GetStatusResponse = await self._call(
            "scheduler", "GetStatus", scheduler_pb2.GetStatusRequest(), token
        )
        return response

    async def overview(self, token: str | None) -> Overview:
        status = await self.status(token)
        name = status.hold.signal
        since = datetime.now(UTC) - HISTORY
        history_request = signal_pb2.GetHistoryRequest(name=name, limit=10_000)
        history_request.since.FromDatetime(since)
        signal, history, forecast, pending, completed = await asyncio.gather(
            self._call("signal", "GetSignal", signal_pb2.GetSignalRequest(name=name), token),
            self._call("signal", "GetHistory", history_request, token),
            self._call("signal", "GetForecast", signal_pb2.GetForecastRequest(name=name), token),
            self.list_tasks(token, state=task_pb2.TASK_STATE_PENDING, page_size=PENDING_PAGE),
            self.list_tasks(token, state=task_pb2.TASK_STATE_COMPLETED, page_size=RATE_PAGE),
        )
        others = await self._other_signals(token, name, since)
        now = time.time()
        self.samples.add(status, now)
        recent = sum(
            1 for t in completed.tasks if t.HasField("finished_at") and now - _seconds(t.finished_at) <= RATE_WINDOW
        )
        return Overview(
            status=status,
            signal=signal.state,
            history=[*history.points],
            forecast=[*forecast.points],
            pending=[*pending.tasks],
            tasks_per_second=recent / RATE_WINDOW,
            samples=self.samples.snapshot(),
            now=datetime.fromtimestamp(now, UTC),
            others=others,
            forecast_issued_at=_seconds(forecast.issued_at) if forecast.version else None,
            forecast_source=forecast.source,
        )

    async def _other_signals(self, token: str | None, default: str, since: datetime) -> list[SignalView]:
        """Each signal but the default one (at most MAX_OTHER_SIGNALS), with its history and forecast."""
        listed = await self._call("signal", "ListSignals", signal_pb2.ListSignalsRequest(), token)
        states = [s for s in listed.signals if s.name != default][:MAX_OTHER_SIGNALS]

        async def view(state: signal_pb2.SignalState) -> SignalView:
            request = signal_pb2.GetHistoryRequest(name=state.name, limit=10_000)
            request.since.FromDatetime(since)
            history, forecast = await asyncio.gather(
                self._call("signal", "GetHistory", request, token),
                self._call("signal", "GetForecast", signal_pb2.GetForecastRequest(name=state.name), token),
            )
            return SignalView(state, [*history.points], [*forecast.points])

        return list(await asyncio.gather(*(view(state) for state in states)))

    async def pending(self, token: str | None) -> list[task_pb2.Task]:
        response = await self.list_tasks(token, state=task_pb2.TASK_STATE_PENDING, page_size=PENDING_PAGE)
        return [*response.tasks]

    async def list_tasks(
        self,
        token: str | None,
        *,
        queue: str = "",
        state: int = 0,
        activity_type: str = "",
        page_size: int = 50,
        page_token: str = "",
    ) -> scheduler_pb2.ListTasksResponse:
        request = scheduler_pb2.ListTasksRequest(
            queue=queue,
            state=task_pb2.TaskState.ValueType(state),
            activity_type=activity_type,
            page_size=page_size,
            page_token=page_token,
        )
        response: scheduler_pb2.ListTasksResponse = await self._call("scheduler", "ListTasks", request, token)
        return response

    async def task(self, token: str | None, task_id: int) -> TaskStory:
        explained, status = await asyncio.gather(
            self._call("scheduler", "ExplainTask", scheduler_pb2.ExplainTaskRequest(id=task_id), token),
            self.status(token),
        )
        placed = explained.task.planned_pool
        name = next((p.signal for p in status.pools if placed and p.name == placed and p.signal), status.hold.signal)
        forecast, state = await asyncio.gather(
            self._call("signal", "GetForecast", signal_pb2.GetForecastRequest(name=name), token),
            self._call("signal", "GetSignal", signal_pb2.GetSignalRequest(name=name), token),
        )
        return TaskStory(
            task=explained.task,
            explanation=explained.explanation,
            reasons=[*explained.reasons],
            forecast=[*forecast.points],
            threshold=state.state.threshold if name != status.hold.signal else status.hold.threshold,
            signal=name,
        )

    async def pause(self, token: str | None, queue: str) -> scheduler_pb2.QueueStatus:
        response = await self._call("scheduler", "PauseQueue", scheduler_pb2.PauseQueueRequest(queue=queue), token)
        return response.queue  # type: ignore[no-any-return]

    async def resume(self, token: str | None, queue: str) -> scheduler_pb2.QueueStatus:
        response = await self._call("scheduler", "ResumeQueue", scheduler_pb2.ResumeQueueRequest(queue=queue), token)
        return response.queue  # type: ignore[no-any-return]

    async def cancel(self, token: str | None, task_id: int) -> task_pb2.Task:
        response = await self._call("scheduler", "CancelTask", scheduler_pb2.CancelTaskRequest(id=task_id), token)
        return response.task  # type: ignore[no-any-return]

    async def retry(self, token: str | None, task_id: int, if_attempt: int | None = None) -> task_pb2.Task:
        request = scheduler_pb2.RetryTaskRequest(id=task_id, if_attempt=if_attempt)
        response = await self._call("scheduler", "RetryTask", request, token)
        return response.task  # type: ignore[no-any-return]

    async def set_signal(self, token: str | None, name: str, value: float) -> signal_pb2.SignalState:
        request = signal_pb2.SetSignalRequest(name=name, value=value)
        response = await self._call("signal", "SetSignal", request, token)
        return response.state  # type: ignore[no-any-return]


def _seconds(stamp: Any) -> float:
    return float(stamp.seconds) + float(stamp.nanos) / 1e9
