"""Single submits multiplexed over one ``SchedulerService.SubmitStream`` call.

Every ``Client.submit`` of a process goes out on one long-lived stream, answered by its ``ref``,
instead of a unary ``SubmitTask`` call each: a call costs the scheduler (and this process) several
times what a submit on the stream does. A message carries every submit made while the one before
was being written. While submits sent are still unanswered (the scheduler is storing them: a
submit sent now would wait for their group's commit anyway), messages go at most every
SPACING_S, so under load each carries more and both sides wake less; a submit made when none is
in flight, or when the last message left longer ago, goes at once. What
the caller sees is what ``SubmitTask`` gives: the stored task, or a ``grpc.aio.AioRpcError`` with
the status and details the scheduler chose.

UNAVAILABLE, for one submit or for the stream (it could not be opened, or broke), is retried as the
unary call retries it (``Calls.call``: ``SubmitTask`` with backoff), with the same caveat: a submit
sent just before the connection broke may have been stored, and the retry stores a second task; an
idempotency key makes that safe. A stream that ends in INTERNAL broke the same way (the scheduler
never ends one with it: it is what grpc.aio reports in place of the scheduler's status when our
write reached a stream the scheduler had just ended, as it does a call its auth refuses,
grpc/grpc#36066), so its submits go again as ``SubmitTask`` calls, which get the real status. A
submit answered INTERNAL on a stream that goes on is the scheduler's answer, and is raised. A
scheduler that does not know ``SubmitStream`` (an older one: UNIMPLEMENTED) is sent ``SubmitTask``
calls from then on. With opentelemetry-api installed, each message carries the caller's W3C trace
context, as an instrumented unary call's metadata would.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import grpc

from lowtide_client._calls import Calls
from lowtide_client._stream_tasks import stream_broke
from lowtide_client._tracing import inject_context
from lowtide_proto.lowtide.v1 import scheduler_pb2, task_pb2

__all__ = ["SubmitStream"]

_CODES = {code.value[0]: code for code in grpc.StatusCode}
# The most submits the scheduler takes in one message.
MAX_SUBMITS_PER_MESSAGE = 1000
# Submits go together while their message stays within this (a larger one goes alone, as a
# SubmitTask call would carry it): well within any receive limit a scheduler sets.
MESSAGE_BYTES = 1024 * 1024
# The least time between two messages while submits are in flight. At 1,000 submits a second
# from one process a message carried 1.3 submits without it and about 3 with it: this process's
# CPU a submit fell a tenth, the scheduler's 8 %, the submit p99 by about half
# (docs/explanation/performance-log.md, "Under load the Python client's messages are spaced"); at
# 100 a second it held none.
SPACING_S = 0.002


def _rpc_error(
    code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, bytes], ...] = ()
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)


def _first(outbox: collections.deque[scheduler_pb2.StreamedSubmit]) -> list[scheduler_pb2.StreamedSubmit]:
    """Takes the submits of the next message from `outbox`: at least one, at most
    MAX_SUBMITS_PER_MESSAGE, more only while they stay within MESSAGE_BYTES."""
    ready = [outbox.popleft()]
    size = ready[0].ByteSize()
    while outbox and len(ready) < MAX_SUBMITS_PER_MESSAGE:
        size += outbox[0].ByteSize()
        if size > MESSAGE_BYTES:
            break
        ready.append(outbox.popleft())
    return ready


class _Stream:
    """One SubmitStream call: its outbox (the submits not yet sent), whether it is ending, and the
    submits it has not answered."""

    def __init__(self, stub: Any) -> None:
        self.outbox: collections.deque[scheduler_pb2.StreamedSubmit] = collections.deque()
        self.ending = False
        self._ready = asyncio.Event()
        self.waiting: dict[int, asyncio.Future[scheduler_pb2.SubmitTaskResponse]] = {}
        self.call = stub.SubmitStream(self._requests())
        self.reader = asyncio.create_task(self._read())

    def send(self, submit: scheduler_pb2.StreamedSubmit) -> None:
        self.outbox.append(submit)
        self._ready.set()

    async def _requests(self) -> AsyncIterator[scheduler_pb2.SubmitStreamRequest]:
        # grpc.aio writes a message and awaits it before asking for the next: what was sent
        # meanwhile goes out together, held for the rest of SPACING_S while some are in flight.
        loop = asyncio.get_running_loop()
        sent_at = float("-inf")
        while True:
            await self._ready.wait()
            hold = sent_at + SPACING_S - loop.time()
            if hold > 0 and len(self.waiting) > len(self.outbox):
                await asyncio.sleep(hold)
            sent_at = loop.time()
            self._ready.clear()
            if self.ending:
                return
            ready = _first(self.outbox)
            if self.outbox:
                self._ready.set()
            yield scheduler_pb2.SubmitStreamRequest(submits=ready)

    async def _read(self) -> None:
        failure: grpc.aio.AioRpcError = _rpc_error(grpc.StatusCode.UNAVAILABLE, "the submit stream ended")
        try:
            async for message in self.call:
                for answer in message.answers:
                    self._answered(answer)
        except grpc.aio.AioRpcError as error:
            failure = error
            if stream_broke(error):
                failure = _rpc_error(
                    grpc.StatusCode.UNAVAILABLE, f"the submit stream broke ({error.code().name}: {error.details()})"
                )
        finally:
            for waiting in self.waiting.values():
                if not waiting.done():
                    waiting.set_exception(failure)
            self.waiting.clear()

    def _answered(self, answer: scheduler_pb2.StreamedAnswer) -> None:
        waiting = self.waiting.pop(answer.ref, None)
        if waiting is None or waiting.done():
            return
        if answer.HasField("submitted"):
            waiting.set_result(answer.submitted)
        else:
            error = answer.error
            code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
            waiting.set_exception(_rpc_error(code, error.message, tuple(error.trailing.items())))

    @property
    def open(self) -> bool:
        return not self.reader.done()

    async def close(self) -> None:
        self.ending = True
        self._ready.set()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader
        self.call.cancel()


class SubmitStream:
    """``Client.submit``'s way to the scheduler: one stream, opened on the first submit and again
    after it ends; ``SubmitTask`` calls instead where the scheduler has no SubmitStream."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._stream: _Stream | None = None
        self._refs = itertools.count(1)
        self._unary = False

    async def submit(self, spec: task_pb2.TaskSpec) -> scheduler_pb2.SubmitTaskResponse:
        if self._unary:
            return await self._unary_submit(spec)
        if self._stream is None or not self._stream.open:
            self._stream = _Stream(self._calls.stub())
        stream, ref = self._stream, next(self._refs)
        answer: asyncio.Future[scheduler_pb2.SubmitTaskResponse] = asyncio.get_running_loop().create_future()
        stream.waiting[ref] = answer
        request = scheduler_pb2.StreamedSubmit(ref=ref, task=spec)
        # The caller's span, if any, is the parent of the scheduler's span of this submit.
        inject_context(request.trace_context)
        stream.send(request)
        try:
            return await answer
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED and self._stream is stream:
                self._unary = True
            elif error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return await self._unary_submit(spec)
        finally:
            stream.waiting.pop(ref, None)

    async def _unary_submit(self, spec: task_pb2.TaskSpec) -> scheduler_pb2.SubmitTaskResponse:
        response: scheduler_pb2.SubmitTaskResponse = await self._calls.call(
            "SubmitTask", scheduler_pb2.SubmitTaskRequest(task=spec)
        )
        return response

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()
