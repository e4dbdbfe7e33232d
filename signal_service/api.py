"""SignalService. Thin: proto in, a call on Signals, proto out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, TypeAlias

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from lowtide import errors
from lowtide.grpc_status import abort, handles_errors
from lowtide_client._proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.domain import Point, SignalState
from signal_service.fanout import Closed
from signal_service.signals import Signals

log = logging.getLogger("lowtide.signal")

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

MAX_HISTORY = 10_000
DEFAULT_HISTORY = 1000


def _timestamp(at: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(at.astimezone(UTC))
    return stamp


def state_message(state: SignalState) -> signal_pb2.SignalState:
    message = signal_pb2.SignalState(
        name=state.name,
        unit=state.unit,
        threshold=state.threshold,
        high=state.high,
        source=state.source,
        version=state.version,
        stale=state.stale,
    )
    if state.value is not None:
        message.value = state.value
    if state.observed_at is not None:
        message.observed_at.CopyFrom(_timestamp(state.observed_at))
    return message


def _points(points: list[Point]) -> list[signal_pb2.SignalPoint]:
    return [signal_pb2.SignalPoint(at=_timestamp(p.at), value=p.value) for p in points]


def _datetime(field: str, stamp: Timestamp) -> datetime:
    """A request's Timestamp; one outside datetime's range is the caller's mistake."""
    try:
        return stamp.ToDatetime(tzinfo=UTC)
    except ValueError as error:
        raise errors.InvalidArgument(field, str(error)) from None


class SignalApi(signal_pb2_grpc.SignalServiceServicer):
    def __init__(self, signals: Signals) -> None:
        self._signals = signals
        self._responses: dict[str, signal_pb2.SubscribeResponse] = {}

    def _response(self, state: SignalState) -> signal_pb2.SubscribeResponse:
        """One message per state, shared by every subscriber it goes to: with a thousand
        subscribers, building it once per subscriber would cost more than sending it."""
        cached = self._responses.get(state.name)
        if cached is None or cached.state.version != state.version:
            cached = signal_pb2.SubscribeResponse(state=state_message(state))
            self._responses[state.name] = cached
        return cached

    @handles_errors
    async def GetSignal(self, request: signal_pb2.GetSignalRequest, context: Context) -> signal_pb2.GetSignalResponse:
        return signal_pb2.GetSignalResponse(state=state_message(await self._signals.reload(request.name)))

    @handles_errors
    async def SetSignal(self, request: signal_pb2.SetSignalRequest, context: Context) -> signal_pb2.SetSignalResponse:
        observed_at = None
        if request.HasField("observed_at"):
            observed_at = _datetime("observed_at", request.observed_at)
        state = await self._signals.set(
            request.name,
            request.value,
            unit=request.unit,
            observed_at=observed_at,
            source=request.source or "manual",
        )
        # An operator's change is worth a line in the log; a feed's many are not.
        log.info(
            "signal.set",
            extra={"signal": state.name, "value": state.value, "source": state.source, "version": state.version},
        )
        return signal_pb2.SetSignalResponse(state=state_message(state))

    async def Subscribe(
        self, request: signal_pb2.SubscribeRequest, context: Context
    ) -> AsyncIterator[signal_pb2.SubscribeResponse]:
        try:
            definition = self._signals.resolve(request.name)
        except errors.LowtideError as error:
            await abort(context, error)
        # The fan-out slot is removed when this generator closes: when the client cancels or
        # goes away, gRPC cancels the task blocked in yield or in next().
        with self._signals.fanout.subscribe(definition.name) as subscription:
            try:
                while True:
                    yield self._response(await subscription.next())
            except Closed:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the signal service is stopping; subscribe again")

    @handles_errors
    async def ListSignals(
        self, request: signal_pb2.ListSignalsRequest, context: Context
    ) -> signal_pb2.ListSignalsResponse:
        states = [s for s in await self._signals.store.states() if s.name in self._signals.defined]
        return signal_pb2.ListSignalsResponse(signals=[state_message(s) for s in states])

    @handles_errors
    async def GetHistory(
        self, request: signal_pb2.GetHistoryRequest, context: Context
    ) -> signal_pb2.GetHistoryResponse:
        definition = self._signals.resolve(request.name)
        if request.limit > MAX_HISTORY:
            raise errors.InvalidArgument("limit", f"must be at most {MAX_HISTORY}")
        since = _datetime("since", request.since) if request.HasField("since") else None
        points = await self._signals.store.history(definition.name, since=since, limit=request.limit or DEFAULT_HISTORY)
        return signal_pb2.GetHistoryResponse(points=_points(points))

    @handles_errors
    async def GetForecast(
        self, request: signal_pb2.GetForecastRequest, context: Context
    ) -> signal_pb2.GetForecastResponse:
        definition = self._signals.resolve(request.name)
        points, source = await self._signals.store.forecast(definition.name)
        return signal_pb2.GetForecastResponse(points=_points(points), source=source)
