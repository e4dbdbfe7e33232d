"""An asyncio client for ``lowtide.v1.SignalService``: read the cost signal, set it from code
(the runtime-config path), and follow every change.

As with ``Client``, errors are not wrapped: a failed call raises its ``grpc.aio.AioRpcError``
(INVALID_ARGUMENT for a NaN, infinite or negative value, NOT_FOUND for an unknown signal).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import AsyncGenerator
from datetime import datetime
from types import TracebackType

import grpc

from lowtide_client._calls import Calls
from lowtide_client._log import log_event
from lowtide_proto.backoff import Backoff
from lowtide_proto.channel import Security
from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc

__all__ = ["SignalClient"]

# Resubscribing: 50 ms doubling to 2 s, so a restarted service is found again within seconds.
_RECONNECT_INITIAL = 0.05
_RECONNECT_MAX = 2.0


class SignalClient:
    """Get, set and subscribe to signals. An empty ``name`` means the default signal.

    ``SignalClient("host:port")`` opens a channel (plaintext, or TLS with ``ca=``) on first
    use and closes it in ``close()``; a ``channel=`` you pass is yours and is never closed here.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50052",
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
        # As the scheduler's Client: UNAVAILABLE (the service starting or failing over) is retried.
        self._calls = Calls(target, security, channel, stub=signal_pb2_grpc.SignalServiceStub)

    async def __aenter__(self) -> SignalClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._calls.close()

    async def get(self, name: str = "") -> signal_pb2.SignalState:
        """The signal's latest state (``HasField("value")`` is false until its first value)."""
        response: signal_pb2.GetSignalResponse = await self._calls.call(
            "GetSignal", signal_pb2.GetSignalRequest(name=name)
        )
        return response.state

    async def set(
        self,
        value: float,
        *,
        name: str = "",
        unit: str = "",
        observed_at: datetime | None = None,
        source: str = "",
    ) -> signal_pb2.SignalState:
        """Set the signal's value and return the new state. A ``unit`` other than the signal's
        own is refused rather than converted."""
        request = signal_pb2.SetSignalRequest(name=name, value=value, unit=unit, source=source)
        if observed_at is not None:
            request.observed_at.FromDatetime(observed_at)
        response: signal_pb2.SetSignalResponse = await self._calls.call("SetSignal", request)
        return response.state

    async def list(self) -> builtins.list[signal_pb2.SignalState]:
        response: signal_pb2.ListSignalsResponse = await self._calls.call(
            "ListSignals", signal_pb2.ListSignalsRequest()
        )
        return [*response.signals]

    async def history(self, name: str = "", *, limit: int = 0) -> builtins.list[signal_pb2.SignalPoint]:
        """Recent values, oldest first (the server's default of 1000 when ``limit`` is 0)."""
        response: signal_pb2.GetHistoryResponse = await self._calls.call(
            "GetHistory", signal_pb2.GetHistoryRequest(name=name, limit=limit)
        )
        return [*response.points]

    async def forecast(self, name: str = "") -> builtins.list[signal_pb2.SignalPoint]:
        """The feed's latest forecast, in time order (empty when it gives none). To be told of
        each new forecast as it is issued, use ``updates()``."""
        response: signal_pb2.GetForecastResponse = await self._calls.call(
            "GetForecast", signal_pb2.GetForecastRequest(name=name)
        )
        return [*response.points]

    async def forecast_issued(self, name: str = "") -> signal_pb2.GetForecastResponse:
        """The feed's latest forecast with where it came from: its points (each with its
        expected error and that error's source), the feed, its version, when it was issued, and
        for a feed that states no error, what the signal's calibration learned
        (``calibration``: bias, error and persistence by lead, and the caution that paid)."""
        response: signal_pb2.GetForecastResponse = await self._calls.call(
            "GetForecast", signal_pb2.GetForecastRequest(name=name)
        )
        return response

    async def subscribe(
        self, name: str = "", *, reconnect: bool = False
    ) -> AsyncGenerator[signal_pb2.SignalState, None]:
        """The current state at once, then every change, until the caller stops iterating (the
        stream is cancelled then, or at ``aclose()``).

        Without ``reconnect``, a lost stream raises its error. With it, UNAVAILABLE (the
        service stopping or unreachable) is retried forever with jittered backoff, and states
        not newer than one already yielded (by ``version``) are skipped, so the caller sees each
        state at most once and in order. Other errors (NOT_FOUND for an unknown signal) are
        raised either way.
        """
        last_version = 0
        async with contextlib.aclosing(self.updates(name, reconnect=reconnect)) as updates:
            async for update in updates:
                if update.state.version > last_version:
                    last_version = update.state.version
                    yield update.state

    async def updates(
        self, name: str = "", *, reconnect: bool = False
    ) -> AsyncGenerator[signal_pb2.SubscribeResponse, None]:
        """``subscribe()`` with the forecast beside the state: each message carries the current
        ``state``, and ``forecast`` (``HasField("forecast")``) in the first message when the feed
        has one and whenever a new one is issued. A message that brings neither a newer state
        nor a newer forecast (a resubscription's first one, say) is skipped."""
        backoff = Backoff(initial=_RECONNECT_INITIAL, maximum=_RECONNECT_MAX)
        last_version = last_forecast = 0
        while True:
            call = self._calls.stub().Subscribe(signal_pb2.SubscribeRequest(name=name))
            try:
                async for response in call:
                    backoff.reset()
                    if response.HasField("forecast") and response.forecast.version <= last_forecast:
                        response.ClearField("forecast")
                    if response.state.version <= last_version and not response.HasField("forecast"):
                        continue
                    last_version = max(last_version, response.state.version)
                    if response.HasField("forecast"):
                        last_forecast = response.forecast.version
                    yield response
                # The server ends a stream only by failing it; an end without a status is a lost stream.
                if not reconnect:
                    return
            except grpc.aio.AioRpcError as exc:
                if not reconnect or exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
            finally:
                call.cancel()
            delay = backoff.next_delay()
            log_event(logging.DEBUG, "signal_client.resubscribing", name=name, delay=round(delay, 3))
            await asyncio.sleep(delay)
