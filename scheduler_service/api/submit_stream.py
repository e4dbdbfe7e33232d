"""SchedulerService.SubmitStream: single submits over one long-lived stream.

A process whose many callers each submit one task (a web app) sends them on one stream instead
of a SubmitTask call each: grpc.aio sets up, answers and tears down every call, and a stream
message costs a fraction of that. A message carries the submits the client had ready, a response
the answers the scheduler had ready: a write is awaited before the next, so what comes while one
is under way goes in the next, and under load each message carries more (no waiting is added).
Each submit is submitted as SubmitTask submits it, concurrently with the others (so they share
group commits), and answered with its `ref` once its task is stored, or with the status
SubmitTask would have ended with.

Bounds: a message carries at most MAX_SUBMITS_PER_MESSAGE submits, and its size is bounded by
gRPC's receive limit, as SubmitTask's; a response carries answers while it stays within
RESPONSE_BYTES (one larger answer alone). While MAX_IN_FLIGHT submits of a stream are unanswered
(submitted, or answered but not yet written to a client that does not read) the stream is not
read, so HTTP/2 flow control holds the client back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from lowtide import errors
from lowtide.grpc_status import abort, status_for
from lowtide_proto.lowtide.v1 import scheduler_pb2, task_pb2

if TYPE_CHECKING:
    import grpc

    from scheduler_service.observe.tracing import TaskTraces

__all__ = ["MAX_IN_FLIGHT", "MAX_SUBMITS_PER_MESSAGE", "SubmitOne", "serve_submit_stream", "stream_error"]

log = logging.getLogger("lowtide.scheduler.api")

MAX_IN_FLIGHT = 1024
MAX_SUBMITS_PER_MESSAGE = 1000
# Answers go together while their response stays within this (a larger one goes alone, as
# SubmitTask's would): well within the 4 MiB a gRPC client receives by default.
RESPONSE_BYTES = 1024 * 1024
# A message's trace context: W3C's traceparent and tracestate, with room to spare.
MAX_TRACE_ENTRIES = 8
MAX_TRACE_BYTES = 512

# SchedulerApi.submit_one: one task submitted by the named submitter (None: auth off).
SubmitOne = Callable[[task_pb2.TaskSpec, "str | None"], Awaitable[scheduler_pb2.SubmitTaskResponse]]


def stream_error(error: errors.LowtideError) -> scheduler_pb2.SubmitStreamError:
    """The status SubmitTask would have ended with, as a message of the stream."""
    return scheduler_pb2.SubmitStreamError(
        code=status_for(error).value[0], message=str(error), trailing=dict(error.trailing)
    )


def _refusal(request: scheduler_pb2.StreamedSubmit) -> errors.InvalidArgument | None:
    """What is wrong with the submit itself (checked before its trace context is read), or None."""
    if not request.HasField("task"):
        return errors.InvalidArgument("task", "is required")
    carried = request.trace_context
    if len(carried) > MAX_TRACE_ENTRIES:
        return errors.InvalidArgument("trace_context", f"{len(carried)} entries, more than {MAX_TRACE_ENTRIES}")
    for key, value in carried.items():
        if len(key.encode()) > MAX_TRACE_BYTES or len(value.encode()) > MAX_TRACE_BYTES:
            too_long = f"an entry of more than {MAX_TRACE_BYTES} bytes ({key[:40]!r})"
            return errors.InvalidArgument("trace_context", too_long)
    return None


async def _answer(
    submit_one: SubmitOne, request: scheduler_pb2.StreamedSubmit, submitter: str | None
) -> scheduler_pb2.StreamedAnswer:
    ref = request.ref
    try:
        return scheduler_pb2.StreamedAnswer(ref=ref, submitted=await submit_one(request.task, submitter))
    except errors.LowtideError as failure:
        return scheduler_pb2.StreamedAnswer(ref=ref, error=stream_error(failure))
    except Exception:
        # As a unary call's unexpected error: INTERNAL for this submit, the stream goes on.
        log.exception("submit_stream.failed ref=%s", ref)
        error = scheduler_pb2.SubmitStreamError(code=13, message="internal error")
        return scheduler_pb2.StreamedAnswer(ref=ref, error=error)


def _submits(request: scheduler_pb2.SubmitStreamRequest) -> Any:
    """The message's submits; a message of none or of too many is no valid request."""
    count = len(request.submits)
    if not 0 < count <= MAX_SUBMITS_PER_MESSAGE:
        raise errors.InvalidArgument("submits", f"{count} in one message, not 1 to {MAX_SUBMITS_PER_MESSAGE}")
    return request.submits


async def serve_submit_stream(
    submit_one: SubmitOne,
    submitter: str | None,
    traces: TaskTraces | None,
    requests: AsyncIterator[scheduler_pb2.SubmitStreamRequest],
    context: grpc.aio.ServicerContext[Any, Any],
) -> None:
    """Submits each request's submits as they come and writes the answers ready as one response.
    The client's end of the stream ends it once every submit is answered; a message that is no
    valid request ends it with INVALID_ARGUMENT, once the submits read before it are answered.
    With tracing on, each submit has a span of its own (TaskTraces.stream_submit)."""
    unanswered = 0
    room = asyncio.Event()
    answers: asyncio.Queue[Any] = asyncio.Queue()
    submitting: set[asyncio.Task[None]] = set()

    async def submit(request: scheduler_pb2.StreamedSubmit) -> None:
        refusal = _refusal(request)
        if refusal is not None:
            answers.put_nowait(scheduler_pb2.StreamedAnswer(ref=request.ref, error=stream_error(refusal)))
        elif traces is None:
            answers.put_nowait(await _answer(submit_one, request, submitter))
        else:
            with traces.stream_submit(request.trace_context, request.ref):
                answers.put_nowait(await _answer(submit_one, request, submitter))

    async def write() -> None:
        nonlocal unanswered
        carried: list[Any] = []  # an answer taken but left for the next response, or the end
        while (answer := carried.pop() if carried else await answers.get()) is not None:
            ready, size = [answer], answer.ByteSize()
            while not answers.empty():
                following = answers.get_nowait()
                if following is None or (size := size + following.ByteSize()) > RESPONSE_BYTES:
                    carried.append(following)
                    break
                ready.append(following)
            await context.write(scheduler_pb2.SubmitStreamResponse(answers=ready))
            unanswered -= len(ready)
            room.set()

    writer = asyncio.create_task(write())
    ended: errors.LowtideError | None = None
    try:
        try:
            async for request in requests:
                for each in _submits(request):
                    task = asyncio.create_task(submit(each))
                    submitting.add(task)
                    task.add_done_callback(submitting.discard)
                unanswered += len(request.submits)
                while unanswered >= MAX_IN_FLIGHT:
                    room.clear()
                    await room.wait()
        except errors.LowtideError as error:
            ended = error
        while submitting:
            await asyncio.wait(set(submitting))
        answers.put_nowait(None)
        await writer
    finally:
        for task in (*submitting, writer):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*submitting, writer, return_exceptions=True)
    if ended is not None:
        await abort(context, ended)
