"""A service's unary calls: one channel, opened lazily, and UNAVAILABLE retried with backoff
(the scheduler's for Client, the signal service's for SignalClient)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import grpc

from lowtide_client._log import log_event
from lowtide_proto.backoff import Backoff
from lowtide_proto.channel import Security, open_channel
from lowtide_proto.durations import format_duration
from lowtide_proto.lowtide.v1 import scheduler_pb2_grpc

__all__ = ["Calls"]

# Retrying UNAVAILABLE: 50 ms doubling to 2 s, giving up once about 10 s have been spent.
_RETRY_INITIAL = 0.05
_RETRY_MAX = 2.0
_RETRY_BUDGET = 10.0


class Calls:
    """Unary calls to one service (``SchedulerService`` unless another ``stub`` class is given)
    over one channel.

    Without a ``channel``, one is opened (with ``security``) on the first call, inside the
    running event loop, which ``grpc.aio`` requires, and closed in ``close()``; a channel
    passed in is never closed here, because whoever made it may share it.
    """

    def __init__(
        self,
        target: str,
        security: Security,
        channel: grpc.aio.Channel | None,
        stub: Callable[[Any], Any] = scheduler_pb2_grpc.SchedulerServiceStub,
    ) -> None:
        self._target = target
        self._make_stub = stub
        self._security = security
        self._channel: Any = channel
        self._owns_channel = channel is None
        self._stub: Any = None
        self._closed = False

    async def close(self) -> None:
        """Close the channel if it was opened here. Safe to call more than once."""
        self._closed = True
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None and self._owns_channel:
            await channel.close()

    def stub(self) -> Any:
        """The service's stub on the channel (opened now if need be); streaming calls go through it."""
        if self._closed:
            raise RuntimeError("the client is closed")
        if self._stub is None:
            if self._channel is None:
                self._channel = open_channel(self._target, self._security)
            self._stub = self._make_stub(self._channel)
        return self._stub

    async def call(self, method: str, request: Any, *, rpc_timeout: float | None = None) -> Any:
        """Make one unary call, retrying UNAVAILABLE with jittered exponential backoff.

        Every call is retried on UNAVAILABLE, submits without an idempotency key included.
        UNAVAILABLE is what gRPC reports when the connection could not be made or the
        scheduler is not serving (starting, restarting, failing over), and in those cases
        the request was never processed, so retrying cannot create a duplicate. The rare
        exception is a connection lost after the request was sent; a submit may then have
        been applied, and the retry creates a second task. Callers for whom that matters
        pass an idempotency key, which makes any retry (ours or theirs) safe. Other status
        codes mean the scheduler answered, and are raised at once.
        """
        backoff = Backoff(initial=_RETRY_INITIAL, maximum=_RETRY_MAX)
        give_up_at = time.monotonic() + _RETRY_BUDGET
        while True:
            rpc = getattr(self.stub(), method)
            try:
                return await rpc(request, timeout=rpc_timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                delay = backoff.next_delay()
                if time.monotonic() + delay > give_up_at:
                    raise
                log_event(
                    logging.DEBUG,
                    "client.retrying",
                    method=method,
                    delay=format_duration(timedelta(milliseconds=round(delay * 1000))),
                    details=exc.details(),
                )
                await asyncio.sleep(delay)
