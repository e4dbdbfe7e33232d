"""WorkerService.Connect: one bidirectional stream per worker.

The first message must be a Hello. After it the scheduler pushes assignments into the worker's
free slots and the worker sends results, heartbeats and slot changes. Every report is fenced by
(task id, attempt): one for an attempt the worker no longer holds is refused, never applied.
Registration and release live in worker_attach, the reading half in worker_reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import duration_pb2

from lowtide.auth import caller
from lowtide.config import AuthConfig
from lowtide.errors import FailedPrecondition, LowtideError, TooLarge, Unavailable
from lowtide.grpc_status import abort
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2, worker_pb2_grpc
from scheduler_service.dispatch.dispatcher import Dispatcher
from scheduler_service.fleet.heartbeats import HeartbeatDeadlines
from scheduler_service.fleet.sessions import MAX_OUTBOX, Registry, WorkerSession
from scheduler_service.holds.fixed_starts import FixedStarts
from scheduler_service.store import Store
from scheduler_service.workers.attach import Attachments, session_from_hello
from scheduler_service.workers.completer import Completer
from scheduler_service.workers.reader import MAX_SLOTS, WorkerReader
from scheduler_service.workers.strays import Strays

if TYPE_CHECKING:
    from scheduler_service.observe.metrics import SchedulerMetrics

__all__ = ["MAX_SLOTS", "WorkerStream", "session_from_hello"]

log = logging.getLogger("lowtide.scheduler.workers")


def _duration(value: timedelta) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromTimedelta(value)
    return out


class WorkerStream(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        dispatcher: Dispatcher,
        completer: Completer,
        beats: HeartbeatDeadlines,
        scheduler_id: str,
        heartbeat_interval: timedelta,
        idle_heartbeat_interval: timedelta,
        lease_timeout: timedelta,
        fixed: FixedStarts,
        metrics: SchedulerMetrics,
        reconnect_grace: timedelta = timedelta(0),
        auth: AuthConfig,
        strays: Strays,
    ) -> None:
        self._auth = auth
        self._registry = registry
        self._dispatcher = dispatcher
        self._completer = completer
        self._heartbeat_interval = heartbeat_interval
        self._idle_heartbeat_interval = idle_heartbeat_interval
        self._lease = lease_timeout
        self.fixed = fixed
        self.metrics = metrics
        self._attachments = Attachments(
            store=store,
            registry=registry,
            dispatcher=dispatcher,
            completer=completer,
            scheduler_id=scheduler_id,
            lease_timeout=lease_timeout,
            reconnect_grace=reconnect_grace,
            cuts=metrics.stream_cuts,
        )
        self._reader = WorkerReader(
            store=store,
            completer=completer,
            beats=beats,
            fixed=fixed,
            metrics=metrics,
            strays=strays,
        )
        # Sessions whose Connect handler still runs (a drain waits for them to end).
        self._live: set[WorkerSession] = set()
        self._none_live = asyncio.Event()
        self._none_live.set()

    @property
    def stopping(self) -> bool:
        """Set once the scheduler stops: new streams are refused, ended ones detach."""
        return self._attachments.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self._attachments.stopping = value

    # Written with context.write() rather than as a generator, so the stub's signature differs.
    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[worker_pb2.WorkerMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        try:
            admitted = await self._admit(request_iterator, context)
        except LowtideError as error:
            await abort(context, error)
        if admitted is None:
            return
        session, stale = admitted
        log.info("worker.connected", extra={"worker_id": session.worker_id, "slots": session.slots})
        self._live.add(session)
        self._none_live.clear()
        reader = asyncio.create_task(self._reader.read(session, request_iterator))
        # Its failure is read by _close when the writing stops first; when a failed write (the
        # worker went away) ends the stream instead, nobody would, and asyncio would log it.
        reader.add_done_callback(_quiet)
        try:
            welcome = worker_pb2.Welcome(
                worker_id=session.worker_id,
                heartbeat_interval=_duration(self._heartbeat_interval),
                lease_timeout=_duration(self._lease),
                idle_heartbeat_interval=_duration(self._idle_heartbeat_interval),
                answers_slot_updates=True,
            )
            await context.write(worker_pb2.SchedulerMessage(welcome=welcome))
            if stale:
                # Listed in the hello but no longer this worker's: stop them, drop their results.
                refs = [task_pb2.TaskRef(task_id=t, attempt=a) for t, a in stale]
                await context.write(worker_pb2.SchedulerMessage(cancel=worker_pb2.CancelTasks(tasks=refs)))
            await self._write(session, reader, context)
            await self._close(session, reader, context)
        finally:
            # Cut: neither ended by the scheduler (a status) nor left by the worker, which asks
            # for no slots first (SlotUpdate(0)), so it may well be on its way back. A bare
            # half-close cannot tell: grpc.aio ends the messages of a reset stream the same way.
            cut = session.end_error is None and session.slots > 0
            reader.cancel()
            self._live.discard(session)
            if not self._live:
                self._none_live.set()
            await self._attachments.end(session, cut=cut)

    async def _admit(
        self, request_iterator: AsyncIterator[worker_pb2.WorkerMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[WorkerSession, list[tuple[int, int]]] | None:
        """The registered session of the stream's hello and the listed attempts it is to stop,
        or None for a stream that ends before its first message."""
        if self.stopping:
            raise Unavailable(
                "the scheduler is shutting down: connect again with backoff (to another replica, or to this "
                "one once it is back), listing running attempts in Hello.running"
            )
        try:
            first = await anext(request_iterator)
        except StopAsyncIteration:
            return None
        if first.WhichOneof("message") != "hello":
            raise FailedPrecondition("the first message on a worker stream must be a hello")
        holds = self._dispatcher.holds.config
        config_held = holds.deferrable.union(*(holds.per_queue or {}).values())
        session = session_from_hello(first.hello, config_held=config_held)
        token = caller(self._auth, context.invocation_metadata() or ())
        session.token_name = token.name if token is not None else None
        return session, await self._attachments.attach(session, first.hello)

    async def _write(
        self, session: WorkerSession, reader: asyncio.Task[None], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Writes the session's outbox to the stream until the reader ends or the session is
        detached, overflows or ends. One task writes, message after message, with nothing set up
        per message; this one waits for it and for what stops it, once."""
        pump = _Pump(session, context)
        writer = asyncio.ensure_future(pump.run())
        stops = [
            asyncio.ensure_future(session.detached.wait()),
            asyncio.ensure_future(session.overflowed.wait()),
            asyncio.ensure_future(session.ended.wait()),
        ]
        overflowed = stops[1]
        try:
            await asyncio.wait({writer, reader, *stops}, return_when=asyncio.FIRST_COMPLETED)
            if writer.done():
                writer.result()  # a write failed: the stream is over
                return
            pump.stopping = True
            if pump.writing and not overflowed.done():
                # The message being written goes out first (unless the worker does not read: a
                # blocked write must still give way to the overflow).
                await asyncio.wait({writer, overflowed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for stop in stops:
                stop.cancel()
            if not writer.done():
                # Cut short (the call is over): its failure is of no interest to anyone.
                writer.cancel()
            writer.add_done_callback(_quiet)

    async def _close(
        self, session: WorkerSession, reader: asyncio.Task[None], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """The writing has stopped: ends the call with the status the session ended with, if any."""
        if session.overflowed.is_set():
            log.warning("worker.not_reading", extra={"worker_id": session.worker_id})
            # Released first: the status itself waits behind the unread messages, so the
            # abort may not return until the worker reads or its connection goes.
            await self._attachments.end(session)
            await abort(
                context,
                TooLarge(f"the worker does not read its stream: over {MAX_OUTBOX} messages are waiting for it"),
            )
        if reader.done() and not reader.cancelled():
            failure = reader.exception()
            if isinstance(failure, LowtideError):
                session.end(failure)
            elif failure is not None:
                raise failure
        # Send what is still queued (rejections of the worker's last reports).
        while not session.outbox.empty() and not context.done():
            await context.write(session.outbox.get_nowait())
        if session.end_error is not None:
            await self._attachments.end(session)
            await abort(context, session.end_error)

    async def settle(self, within: float) -> None:
        """Waits (up to `within` seconds) for every report taken and every release started."""
        pending = [asyncio.ensure_future(self._completer.flushed()), *self._attachments.releases.values()]
        await asyncio.wait(pending, timeout=within)

    async def drain(self, grace: float, reason: str = "the scheduler is shutting down") -> None:
        """Sends every stream a Drain, then waits up to `grace` seconds for the workers to finish
        what they run, report it and close their streams. New streams are refused meanwhile."""
        self.stopping = True
        deadline = datetime.now(UTC) + timedelta(seconds=grace)
        message = worker_pb2.Drain(reason=reason, grace=_duration(timedelta(seconds=grace)))
        message.deadline.FromDatetime(deadline)
        self._attachments.drain_message = message
        for session in self._registry:
            session.draining = True
            session.send(worker_pb2.SchedulerMessage(drain=message))
            log.info("worker.draining", extra={"worker_id": session.worker_id, "running": len(session.in_flight)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_live.wait(), grace)


class _Pump:
    """Writes a session's outbox to its stream in order, until told to stop after its write."""

    def __init__(self, session: WorkerSession, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._session = session
        self._context = context
        self.writing = False
        self.stopping = False

    async def run(self) -> None:
        outbox = self._session.outbox
        while not self.stopping:
            message = await outbox.get()
            self.writing = True
            # A worker that does not read blocks this write (flow control); _write lets the
            # overflow cut it short.
            await self._context.write(message)
            self.writing = False


def _quiet(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
