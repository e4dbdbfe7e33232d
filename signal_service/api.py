"""SignalService. Thin: proto in, a call on Signals, proto out."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from lowtide import errors
from lowtide.forecast_calibration import Calibration
from lowtide.grpc_status import abort, handles_errors
from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from signal_service.domain import Point, SignalForecast, SignalState
from signal_service.fanout import Closed, Update
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


def _points(points: Sequence[Point]) -> list[signal_pb2.SignalPoint]:
    return [
        signal_pb2.SignalPoint(
            at=_timestamp(p.at),
            value=p.value,
            expected_error=p.expected_error,
            error_source=p.error_source,
            bias=p.bias,
        )
        for p in points
    ]


def calibration_message(calibration: Calibration, lead_scale: float) -> signal_pb2.ForecastCalibration:
    persistence = list(calibration.persistence) or [0.0] * len(calibration.buckets)
    follow = list(calibration.follow) or [0.0] * len(calibration.buckets)
    residual = list(calibration.residual) or [0.0] * len(calibration.buckets)
    shares = list(calibration.profile_share) or [0.0] * len(calibration.buckets)
    return signal_pb2.ForecastCalibration(
        buckets=[
            signal_pb2.CalibrationBucket(
                from_hours=b.lo_h,
                to_hours=0.0 if math.isinf(b.hi_h) else b.hi_h,
                forecasts=b.forecasts,
                samples=b.samples,
                bias=b.bias,
                error=b.stddev,
                persistence=persists,
                follow=follows,
                residual=left,
                profile_share=share,
            )
            for b, persists, follows, left, share in zip(
                calibration.buckets, persistence, follow, residual, shares, strict=True
            )
        ],
        day_profile=list(calibration.profile),
        follows=bool(calibration.follow),
        raw=calibration.raw,
        follow_raw=calibration.follow_raw,
        caution=calibration.caution,
        caution_jobs=calibration.caution_jobs,
        caution_slope=calibration.caution_slope,
        days=calibration.days,
        lead_scale=lead_scale,
        learned_at=_timestamp(calibration.at),
    )


def forecast_message(forecast: SignalForecast) -> signal_pb2.Forecast:
    message = signal_pb2.Forecast(points=_points(forecast.points), source=forecast.source, version=forecast.version)
    if forecast.issued_at is not None:
        message.issued_at.CopyFrom(_timestamp(forecast.issued_at))
    if forecast.calibration is not None:
        message.calibration.CopyFrom(calibration_message(forecast.calibration, forecast.lead_scale))
    return message


def _datetime(field: str, stamp: Timestamp) -> datetime:
    """A request's Timestamp; one outside datetime's range is the caller's mistake."""
    try:
        return stamp.ToDatetime(tzinfo=UTC)
    except ValueError as error:
        raise errors.InvalidArgument(field, str(error)) from None


class SignalApi(signal_pb2_grpc.SignalServiceServicer):
    def __init__(self, signals: Signals) -> None:
        self._signals = signals
        # Per signal, the last message sent without a forecast and the last sent with one.
        self._responses: dict[tuple[str, bool], tuple[tuple[int, int], signal_pb2.SubscribeResponse]] = {}

    def _response(self, update: Update) -> signal_pb2.SubscribeResponse:
        """One message per state (and forecast), built once and shared by every subscriber it
        goes to: with a thousand subscribers, building it once per subscriber would cost more
        than sending it."""
        state, forecast = update
        key = (state.version, 0 if forecast is None else forecast.version)
        slot = (state.name, forecast is not None)
        cached = self._responses.get(slot)
        if cached is None or cached[0] != key:
            message = signal_pb2.SubscribeResponse(state=state_message(state))
            if forecast is not None:
                message.forecast.CopyFrom(forecast_message(forecast))
            cached = self._responses[slot] = (key, message)
        return cached[1]

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
        forecast = await self._signals.reload_forecast(definition.name)
        if forecast is None:
            return signal_pb2.GetForecastResponse()
        message = forecast_message(forecast)
        response = signal_pb2.GetForecastResponse(points=message.points, source=message.source, version=message.version)
        if message.HasField("issued_at"):
            response.issued_at.CopyFrom(message.issued_at)
        if message.HasField("calibration"):
            response.calibration.CopyFrom(message.calibration)
        return response
