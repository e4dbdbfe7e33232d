"""The side tasks of one ``WorkerService.Connect`` stream, beside its reader and writer: the
heartbeat, the worker's own holds, the results written in batches, the close after a Drain, and
which errors end a stream to connect again.
They put messages on the stream's outgoing queue, which its one writer sends in order."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from typing import Any

import grpc

from lowtide_client._attempts import Attempts
from lowtide_client._holds import CostHold, held_now
from lowtide_client._log import log_event
from lowtide_proto.lowtide.v1 import worker_pb2


class Signal(enum.Enum):
    FLUSH = "flush"  # write every waiting result now
    END = "end"  # write every waiting result, then close the request side


Outgoing = worker_pb2.WorkerMessage | Signal


async def write_results(call: Any, attempts: Attempts, max_batch: int) -> None:
    # Everything waiting goes out together, max_batch per message. A batch leaves the list only
    # once written, so after a failed write the next stream sends it again.
    while attempts.unsent:
        batch = attempts.unsent[:max_batch]
        await call.write(worker_pb2.WorkerMessage(results=worker_pb2.Results(results=batch)))
        attempts.mark_sent(batch)
        log_event(logging.DEBUG, "worker.results_sent", count=len(batch))


async def close_when_drained(drained: asyncio.Event, attempts: Attempts, queue: asyncio.Queue[Outgoing]) -> None:
    """After a Drain: once every running attempt has finished, send the results and close
    the stream. Cancelled with the stream when the scheduler ends it first (at the drain's
    deadline): the attempts keep running and the next Hello lists them."""
    await drained.wait()
    while attempts.running:
        await asyncio.wait(attempts.tasks(), return_when=asyncio.FIRST_COMPLETED)
    queue.put_nowait(Signal.END)


async def heartbeat_loop(
    attempts: Attempts,
    queue: asyncio.Queue[Outgoing],
    interval: float,
    idle_interval: float | None,
    assignments_read: Callable[[], int | None],
) -> None:
    """Beats every `interval` while attempts run (more often for short heartbeat timeouts),
    every `idle_interval` while nothing does; an attempt starting wakes it to beat on time."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        due = last + attempts.heartbeat_period(interval, idle_interval) - loop.time()
        if due <= 0:
            # Every attempt still ours (results not yet written included), and how many
            # assignments were read meanwhile: the scheduler hands out again what it sent and
            # this worker never got.
            heartbeat = worker_pb2.Heartbeat(running=attempts.unreported_refs(), details=attempts.take_details())
            read = assignments_read()
            if read is not None:
                heartbeat.assignments_read = read
            queue.put_nowait(worker_pb2.WorkerMessage(heartbeat=heartbeat))
            last = loop.time()
            continue
        # A new attempt with a short heartbeat timeout (or the first after an idle wait)
        # wakes us to shorten the wait.
        attempts.beat_at = loop.time() + due
        attempts.busy_period = interval
        attempts.started.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(attempts.started.wait(), due)


async def hold_loop(holds: tuple[CostHold, ...], every: float, queue: asyncio.Queue[Outgoing]) -> None:
    """Evaluates the worker's own holds and tells the scheduler each change (and, on a new
    stream, the current set at once: the Hello named it already, but a scheduler older than
    Hello.held_types learns it only from this HoldUpdate)."""
    sent: frozenset[str] | None = None
    while True:
        held = held_now(holds)
        if held != sent:
            update = worker_pb2.HoldUpdate(held_types=sorted(held))
            queue.put_nowait(worker_pb2.WorkerMessage(hold_update=update))
            log_event(logging.INFO, "worker.hold_changed", held=",".join(sorted(held)) or "-")
            sent = held
        await asyncio.sleep(every)


def stream_broke(error: grpc.aio.AioRpcError) -> bool:
    """Whether a stream's error means: connect again. UNAVAILABLE (the scheduler stopping, the
    connection gone), or INTERNAL, which the scheduler never ends a stream with: it is what a
    proxy in front reports when its connection to the scheduler resets ("RST_STREAM with error
    code 2"), and what grpc.aio reports in place of the real status when a write of ours failed
    as the stream ended ("Internal error from Core", grpc/grpc#36066). If the real one named
    something to fix, the next stream gets it again, unmasked."""
    return error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
