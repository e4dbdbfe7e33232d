"""One ``Worker.run()``: the ``WorkerService.Connect`` stream, its reconnects, and shutdown.

A stream starts with a Hello and the scheduler's Welcome; then three tasks run side by side
until it ends:

* the reader applies scheduler messages (assignments, cancels, drain, rejected reports);
* the sender is the stream's only writer, fed by one queue, so writes never interleave;
* the heartbeat loop queues a Heartbeat naming every running attempt.

Attempts and unsent results live in ``Attempts`` and survive a broken stream: the next
Hello lists the attempts, and the waiting results follow the Welcome. A Drain (the scheduler
is going) ends one stream, not the worker: no new work is taken on it, the running attempts
finish and are reported, the stream is closed, and the worker connects again with backoff. Reports are delivered
at least once at best: a result written just before the stream broke may be lost, and then
the scheduler's lease or timeouts re-dispatch the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc

from lowtide_client import _stream_tasks as side_tasks
from lowtide_client._activities import Activity
from lowtide_client._attempts import Attempts
from lowtide_client._holds import CostHold, held_now
from lowtide_client._log import log_event
from lowtide_client._stream_tasks import Outgoing, Signal
from lowtide_proto.backoff import Backoff
from lowtide_proto.durations import format_duration
from lowtide_proto.lowtide.v1 import worker_pb2, worker_pb2_grpc

__all__ = ["Runtime", "Settings"]

# Reconnects after UNAVAILABLE or an unexpected end: 100 ms doubling to 5 s.
_RECONNECT_INITIAL = 0.1
_RECONNECT_MAX = 5.0
# Used when the Welcome names no heartbeat interval.
_DEFAULT_HEARTBEAT = 10.0
# A scheduler that accepts the stream but never welcomes us is treated like an outage.
_WELCOME_TIMEOUT = 30.0
# Once all attempts are over: time to flush the results and let the scheduler end the stream.
_CLOSE_TIMEOUT = 10.0
# How long a stopping worker waits for the scheduler to answer its SlotUpdate(0) (a round trip,
# normally): past it, a scheduler that does not answer is not waited for any longer.
_ANSWER_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Settings:
    target: str
    pool: str
    queues: tuple[str, ...]
    slots: int
    max_result_batch: int
    shutdown_grace: float  # seconds
    cost_deferrable_activities: tuple[str, ...] = ()
    cost_holds: tuple[CostHold, ...] = ()
    hold_check_interval: float = 0.25  # seconds


class Runtime:
    """The state of one run: made by ``Worker.run()`` and dropped when it returns."""

    def __init__(
        self,
        *,
        settings: Settings,
        worker_id: str,
        activities: Mapping[str, Activity],
        executor: Executor,
        stop_event: asyncio.Event,
    ) -> None:
        self.worker_id = worker_id
        self._settings = settings
        self._activity_types = [worker_pb2.ActivityType(name=a.name, local=a.local) for a in activities.values()]
        self._attempts = Attempts(
            activities=activities, executor=executor, slots=settings.slots, on_result=self._queue_flush
        )
        self._stop_event = stop_event
        self._closing_event = asyncio.Event()
        self._stopping = False  # no new work wanted: SlotUpdate(0) sent, or owed to the next stream
        self._closing = False  # all work over: flush the results and close the stream
        self._drained = asyncio.Event()  # the scheduler sent Drain on the current stream
        # Set once the scheduler has answered our SlotUpdate(0) (SlotsTaken): nothing more is on
        # its way to us. Set from the start, and on a stream whose scheduler does not answer.
        self._slots_taken = asyncio.Event()
        self._slots_taken.set()
        self._answered = False  # the current stream's scheduler answers SlotUpdates
        self._connecting = False  # a stream's Hello is sent and its Welcome not yet read
        # The current stream's outgoing queue; None while disconnected.
        self._outgoing: asyncio.Queue[Outgoing] | None = None
        self._flush_queued = False
        # Assignment entries read on the current stream (Heartbeat.assignments_read).
        self._assignments_read = 0

    async def serve(self, channel: Any) -> None:
        """Keep a stream up until a stop request has been carried out, or a fatal error."""
        loop = asyncio.get_running_loop()
        connection = loop.create_task(self._connection_loop(channel), name="lowtide-worker-stream")
        try:
            stop_waiter = loop.create_task(self._stop_event.wait())
            try:
                await asyncio.wait({connection, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_waiter.cancel()
            if not connection.done():
                await self._drain(connection)
            if not connection.done():
                self._begin_close()
                try:
                    await asyncio.wait_for(connection, _CLOSE_TIMEOUT)
                except TimeoutError:
                    log_event(logging.WARNING, "worker.close_timed_out", unsent_results=len(self._attempts.unsent))
            if not connection.cancelled():  # cancelled: the close timed out, already logged
                connection.result()  # raises the stream's fatal error, if there was one
        finally:
            connection.cancel()
            await asyncio.gather(connection, return_exceptions=True)
            await self._attempts.abandon_all("worker stopped")

    async def _drain(self, connection: asyncio.Task[None]) -> None:
        """Take no new work and give running attempts up to ``shutdown_grace`` to finish."""
        self._stopping = True
        self._ask_for_no_slots(self._outgoing)
        log_event(logging.INFO, "worker.draining", worker_id=self.worker_id, running=len(self._attempts.running))
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._settings.shutdown_grace
        unanswered_until = loop.time() + _ANSWER_TIMEOUT

        def awaiting_answer() -> bool:
            return not self._slots_taken.is_set() and loop.time() < unanswered_until

        # Assignments already on their way when we stopped still start, so look again each time,
        # and until the scheduler says it has taken the zero in, more may be on their way.
        while (self._attempts.running or awaiting_answer()) and not connection.done():
            remaining = give_up_at - loop.time()
            if remaining <= 0:
                break
            waiting: set[asyncio.Future[Any]] = {connection, *self._attempts.tasks()}
            answered = asyncio.ensure_future(self._slots_taken.wait()) if awaiting_answer() else None
            if answered is not None:
                waiting.add(answered)
                remaining = min(remaining, unanswered_until - loop.time())
            try:
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if answered is not None:
                    answered.cancel()
        if self._attempts.running and not connection.done():
            await self._attempts.abandon_all("shutdown grace passed")

    def _ask_for_no_slots(self, queue: asyncio.Queue[Outgoing] | None) -> None:
        """Tells the scheduler to send nothing more (SlotUpdate(0)), asking it to answer once it has
        taken that in: until the answer, work it sent before may still be on its way, and runs."""
        if queue is None:
            # No stream to ask on; the next one asks once welcomed (self._stopping). A stream being
            # opened may already be sent work before its Welcome is read: wait for it to ask.
            if self._connecting:
                self._slots_taken.clear()
            return
        if self._answered:
            self._slots_taken.clear()
        else:
            self._slots_taken.set()
        queue.put_nowait(worker_pb2.WorkerMessage(slot_update=worker_pb2.SlotUpdate(slots=0, answer=True)))

    def _begin_close(self) -> None:
        self._closing = True
        self._closing_event.set()
        if self._outgoing is not None:
            self._outgoing.put_nowait(Signal.END)

    async def _connection_loop(self, channel: Any) -> None:
        backoff = Backoff(initial=_RECONNECT_INITIAL, maximum=_RECONNECT_MAX)
        while True:
            if self._closing and not self._attempts.unsent:
                return
            try:
                if await self._session(channel, backoff):
                    return
                reason = "drained by the scheduler" if self._drained.is_set() else "stream ended"
            except grpc.aio.AioRpcError as exc:
                if not side_tasks.stream_broke(exc):
                    raise
                reason = f"{exc.code().name}: {exc.details()}"
            except TimeoutError:
                reason = "no welcome"
            if self._closing and not self._attempts.unsent:
                return
            delay = backoff.next_delay()
            log_event(
                logging.WARNING,
                "worker.reconnecting",
                worker_id=self.worker_id,
                delay=format_duration(timedelta(milliseconds=round(delay * 1000))),
                reason=reason,
                running=len(self._attempts.running),
                unsent_results=len(self._attempts.unsent),
            )
            if self._closing:
                # Already closing, with results still to deliver: the event is set, so waiting
                # on it would not wait at all; back off for real until the close timeout.
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing_event.wait(), delay)

    async def _session(self, channel: Any, backoff: Backoff) -> bool:
        """One stream, from Hello to its end. True when it closed as planned (after stop)."""
        call = worker_pb2_grpc.WorkerServiceStub(channel).Connect()
        helpers: list[asyncio.Task[None]] = []
        self._drained.clear()
        self._connecting = True
        self._assignments_read = 0
        try:
            await call.write(worker_pb2.WorkerMessage(hello=self._hello()))
            first = await asyncio.wait_for(call.read(), _WELCOME_TIMEOUT)
            if first is grpc.aio.EOF:
                return False
            if first.WhichOneof("message") != "welcome":
                raise RuntimeError(f"protocol error: expected a Welcome, got {first.WhichOneof('message')}")
            interval, idle_interval = self._welcome(first.welcome)
            backoff.reset()
            lease = first.welcome.lease_timeout.ToTimedelta().total_seconds()
            if lease > 0:
                # Reconnect well within the lease, or the scheduler gives our attempts away.
                backoff.cap(min(_RECONNECT_MAX, lease / 4))
            queue: asyncio.Queue[Outgoing] = asyncio.Queue()
            self._outgoing = queue
            self._connecting = False
            self._flush_queued = False
            if self._stopping:
                self._ask_for_no_slots(queue)
            if self._attempts.unsent:
                self._queue_flush()
            if self._closing:
                queue.put_nowait(Signal.END)
            sender = asyncio.create_task(self._send_loop(call, queue))
            reader = asyncio.create_task(self._read_loop(call))
            helpers = [
                sender,
                reader,
                asyncio.create_task(
                    side_tasks.heartbeat_loop(self._attempts, queue, interval, idle_interval, self._assignments_known)
                ),
                asyncio.create_task(side_tasks.close_when_drained(self._drained, self._attempts, queue)),
            ]
            if self._settings.cost_holds:
                holds = side_tasks.hold_loop(self._settings.cost_holds, self._settings.hold_check_interval, queue)
                helpers.append(asyncio.create_task(holds))
            await asyncio.wait({sender, reader}, return_when=asyncio.FIRST_COMPLETED)
            if sender.done() and sender.exception() is None:
                # All written and the request side closed; the scheduler now ends the stream.
                # After a stop that is the end; after a drain the worker connects again.
                await reader
                return self._closing
            if not reader.done():
                # A write failed, so the call is over; the reader learns its status.
                await asyncio.wait({reader}, timeout=_CLOSE_TIMEOUT)
            if reader.done():
                reader.result()  # raises the stream's error, if it had one
            else:
                log_event(logging.WARNING, "worker.write_failed", error=repr(sender.exception()))
            return False
        finally:
            self._outgoing = None
            self._connecting = False
            # The stream is over: nothing more can be on its way on it.
            self._slots_taken.set()
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            call.cancel()

    def _hello(self) -> worker_pb2.Hello:
        # Attempts whose results are still unsent are listed too: they stay this worker's
        # until the results arrive, right after the Welcome. The types its own holds hold now go
        # in it, so not even the scheduler's first claim for this stream hands it one of them.
        # A stopping worker connects only to report: it asks for one slot (the fewest a Hello may
        # name), which the attempts it lists fill, so that claim finds none of its slots free
        # either; the SlotUpdate(0) after the Welcome says the rest.
        return worker_pb2.Hello(
            worker_id=self.worker_id,
            pool=self._settings.pool,
            queues=self._settings.queues,
            activity_types=self._activity_types,
            slots=1 if self._stopping else self._settings.slots,
            running=self._attempts.unreported_refs(),
            cost_deferrable_activities=self._settings.cost_deferrable_activities,
            held_types=sorted(held_now(self._settings.cost_holds)),
        )

    def _welcome(self, welcome: worker_pb2.Welcome) -> tuple[float, float | None]:
        """The heartbeat intervals the Welcome names: busy, and idle (None from a scheduler that
        names none: then the worker beats at the busy interval, idle or not)."""
        if welcome.worker_id:
            self.worker_id = welcome.worker_id
        self._answered = welcome.answers_slot_updates
        interval = welcome.heartbeat_interval.ToTimedelta().total_seconds()
        if interval <= 0:
            interval = _DEFAULT_HEARTBEAT
        idle: float | None = None
        if welcome.HasField("idle_heartbeat_interval"):
            idle = welcome.idle_heartbeat_interval.ToTimedelta().total_seconds()
            idle = idle if idle > 0 else None
        log_event(
            logging.INFO,
            "worker.connected",
            worker_id=self.worker_id,
            target=self._settings.target,
            pool=self._settings.pool,
            queues=",".join(self._settings.queues),
            slots=self._settings.slots,
            heartbeat_interval=format_duration(timedelta(seconds=interval)),
            idle_heartbeat_interval=format_duration(timedelta(seconds=idle)) if idle else "-",
            running=len(self._attempts.running),
            unsent_results=len(self._attempts.unsent),
        )
        return interval, idle

    async def _send_loop(self, call: Any, queue: asyncio.Queue[Outgoing]) -> None:
        """The stream's only writer: queued messages go out in order, results in batches."""
        while True:
            item = await queue.get()
            if item is Signal.FLUSH:
                # Cleared before writing, so results finishing meanwhile queue another flush.
                self._flush_queued = False
                await side_tasks.write_results(call, self._attempts, self._settings.max_result_batch)
            elif item is Signal.END:
                await side_tasks.write_results(call, self._attempts, self._settings.max_result_batch)
                await call.done_writing()
                log_event(logging.INFO, "worker.stream_closing", worker_id=self.worker_id)
                return
            else:
                await call.write(item)

    async def _read_loop(self, call: Any) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            self._handle(message)

    def _assignments_known(self) -> int | None:
        """Heartbeat.assignments_read; None while stopping (what is given up then is lost, not put back)."""
        return None if self._stopping or self._closing or self._drained.is_set() else self._assignments_read

    def _send(self, message: worker_pb2.WorkerMessage) -> None:
        if self._outgoing is not None:
            self._outgoing.put_nowait(message)

    def _queue_flush(self) -> None:
        if self._outgoing is not None and not self._flush_queued:
            self._flush_queued = True
            self._outgoing.put_nowait(Signal.FLUSH)

    def _handle(self, message: worker_pb2.SchedulerMessage) -> None:
        kind = message.WhichOneof("message")
        if kind == "assignments":
            self._assignments_read += len(message.assignments.assignments)
            for assignment in message.assignments.assignments:
                if self._closing or self._drained.is_set():
                    # The stream is closing; the scheduler re-dispatches what it still holds.
                    ref = assignment.task
                    log_event(logging.INFO, "worker.assignment_declined", task_id=ref.task_id, attempt=ref.attempt)
                else:
                    self._attempts.start(assignment)
        elif kind == "slots_taken":
            if message.slots_taken.slots == 0:
                self._slots_taken.set()
        elif kind == "cancel":
            for ref in message.cancel.tasks:
                self._attempts.forget(ref, event="worker.attempt_cancelled", reason="cancelled by the scheduler")
        elif kind == "rejected":
            for report in message.rejected.reports:
                self._attempts.forget(report.task, event="worker.report_rejected", reason=report.reason)
        elif kind == "drain":
            log_event(
                logging.INFO,
                "worker.drain_requested",
                reason=message.drain.reason,
                running=len(self._attempts.running),
            )
            self._drained.set()
        else:
            log_event(logging.WARNING, "worker.unexpected_message", kind=kind)
