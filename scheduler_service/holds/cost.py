"""The scheduler's view of the cost signal, and the hold it implies.

The scheduler subscribes to the signal service and keeps the latest state in memory; the
dispatcher reads it once before each claim — no query and no RPC per claim. Until the first value
arrives the signal counts as high, so held work never starts before the scheduler knows the
signal. When the hold ends, every dispatcher is woken at once (push, not poll).

A view is trusted for held work only while it is confirmed: a value streamed or read from the
stored row (the signal service's truth) within CONFIRM_WITHIN, and, once the replica's event loop
has stalled (a frozen process, a starved machine), only a stored row read after the stall: what
the stream or a NOTIFY delivers after one may be old news, with newer values still queued behind
it. Before claiming held types on an unconfirmed view, the dispatcher reads the row (`confirm`):
one query per signal and CONFIRM_WITHIN at most, never one per task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta

import grpc

from lowtide.calibrated_forecast import planning_points, shared_error
from lowtide.forecast_replay import JOB_SLACKS, MIN_JOBS, windowed
from lowtide_client import SignalClient
from lowtide_proto.backoff import Backoff
from lowtide_proto.channel import Security, keepalive_options, open_channel
from lowtide_proto.lowtide.v1 import signal_pb2
from scheduler_service.domain.holds import (
    HoldConfig,
    HoldPolicy,
    SignalView,
    held_types,
    initial_hold,
    next_hold,
)
from scheduler_service.domain.planning import CAUTION, RELEASE_LEAD, Forecast
from scheduler_service.domain.timings import HoldEpisode
from scheduler_service.holds.snapshot import HoldSnapshot
from scheduler_service.wire.forecast import calibration_of

log = logging.getLogger("lowtide.scheduler.cost")

# How long a confirmed view is trusted for held work without a newer word (a streamed state, or
# the stored row read); no longer than the soak allows a change to take to reach dispatch.
CONFIRM_WITHIN = 2.0
# The event loop not running for this long counts as a stall: the process was frozen or starved,
# and what waited in its sockets meanwhile is read only now.
STALL = 1.0


class LoopWatch:
    """Notices the replica's event loop not running for STALL or more (monotonic time jumps
    between two looks), from its own ticks and from every look anyone takes (`look`), so a
    stall is noticed by whoever runs first after it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, stall: float = STALL) -> None:
        self._clock = clock
        self._stall = stall
        self._last_look = clock()
        # When the latest stall was noticed (-inf: never).
        self.last_stall = -math.inf

    def look(self) -> float:
        """Now (monotonic), after noting a stall since the last look."""
        now = self._clock()
        if now - self._last_look > self._stall:
            self.last_stall = now
            log.info("loop.stalled", extra={"seconds": round(now - self._last_look, 3)})
        self._last_look = max(self._last_look, now)
        return now

    async def run(self) -> None:
        while True:
            self.look()
            await asyncio.sleep(self._stall / 4)


class CostHolds:
    def __init__(
        self,
        *,
        target: str,
        signal: str,
        policy: HoldPolicy,
        config: HoldConfig,
        on_release: Callable[[], None],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        token: str | None = None,
        ca: str | None = None,
        stale_after: timedelta | None = None,
        keepalive: tuple[int, int] | None = None,
        read: Callable[[str], Awaitable[SignalView | None]] | None = None,
        watch: LoopWatch | None = None,
    ) -> None:
        self.target = target
        # The token and CA to reach the signal service with ([auth] signal_token, [tls] signal_ca).
        self.token = token
        self.ca = ca
        self.signal_name = signal
        self.policy = policy
        self.config = config
        self._on_release = on_release
        self._clock = clock
        self.signal: SignalView | None = None
        self.state = initial_hold(policy, clock())
        # The stored state of a signal, by name (None: no confirmation, the view is always trusted).
        self._read = read
        self.watch = watch or LoopWatch()
        # When (monotonic) the view was last confirmed by the stream, and by a stored read's start.
        self._streamed = -math.inf
        self._read_at = -math.inf
        # The latest hold that ended (for the time-held histogram); None: none has yet.
        self.last_hold: HoldEpisode | None = None
        self.connected = False
        # The Subscribe channel's keepalive (time, timeout in ms); None: lowtide_proto.channel's.
        self.keepalive = keepalive
        self._recheck: asyncio.TimerHandle | None = None
        # The signal service sends every new version (a value, or its own stale mark after
        # stale_after without one). When none comes for stale_after, whether the stream ended or
        # stays open but silent (a half-open connection, a frozen service), nobody will tell us
        # the value has aged: the scheduler marks the last value stale itself.
        self.stale_after = stale_after
        self._stale_timer: asyncio.TimerHandle | None = None
        self._stale_version: int | None = None
        # The feed's forecast as of the latest state (None: the feed gives none), and where from.
        self.forecast: Forecast | None = None
        self.forecast_source = ""
        # How many standard deviations of a point's error a plan allows for: the caution the
        # signal's calibration found to pay on this feed, else the planner's default.
        self.forecast_caution = CAUTION
        # How much it falls per doubling of the window a task has left (in the feed's time: a wall-clock
        # window times `_lead_scale`), when the calibration found that to pay (`planning_caution`).
        self.forecast_caution_slope = 0.0
        self._lead_scale = 1.0
        # Grows with every new forecast, so the planner knows when to plan again.
        self.forecast_version = 0
        # The feed's latest forecast as streamed by the signal service (None: none yet).
        self._feed_forecast: signal_pb2.Forecast | None = None

    @property
    def value(self) -> float | None:
        return None if self.signal is None else self.signal.value

    def held_for(
        self, queue: str, *, worker_deferrable: Iterable[str] = (), worker_held: Iterable[str] = ()
    ) -> frozenset[str]:
        return held_types(
            queue,
            hold=self.state,
            config=self.config,
            worker_deferrable=worker_deferrable,
            worker_held=worker_held,
        )

    def update(self, signal: SignalView | None) -> None:
        """Takes a new signal state (or, with the same one, lets time pass for min_hold)."""
        self.signal = signal
        before = self.state
        self.state = next_hold(before, signal, self.policy, self._clock())
        if before.active != self.state.active:
            log.info("cost_hold.changed", extra={"active": self.state.active, "reason": self.state.reason})
        if before.active and not self.state.active:
            if before.since is not None and self.state.since is not None:
                self.last_hold = HoldEpisode(before.since, self.state.since)
            self._on_release()
        self._schedule_min_hold_check()

    def _schedule_min_hold_check(self) -> None:
        # A hold kept only by min_hold ends when min_hold has passed, with no new signal value.
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if self.state.active and self.state.since is not None and self.policy.min_hold:
            left = (self.state.since + self.policy.min_hold - self._clock()).total_seconds()
            if left > 0:
                loop = asyncio.get_running_loop()
                self._recheck = loop.call_later(left + 0.001, self.update, self.signal)

    async def run(self) -> None:
        """Subscribes, and resubscribes with jittered backoff whenever the stream ends."""
        backoff = Backoff(initial=0.1, maximum=5.0)
        warned = False
        while True:
            options = () if self.keepalive is None else keepalive_options(*self.keepalive)
            channel = open_channel(self.target, Security(token=self.token, ca=self.ca, options=options))
            try:
                async with SignalClient(self.target, channel=channel) as client:
                    async for update in client.updates(self.signal_name):
                        state = update.state
                        if not self.connected:
                            log.info("signal.subscribed", extra={"target": self.target, "signal": self.signal_name})
                        self.connected = True
                        backoff.reset()
                        warned = False
                        if self.signal is not None and state.version < self.signal.version:
                            # Already taken, newer, from the stored row (take_stored).
                            continue
                        self._streamed = self.watch.look()
                        self._restart_stale_timer(state.version)
                        self.update(
                            SignalView(
                                name=state.name,
                                value=state.value if state.HasField("value") else None,
                                threshold=state.threshold,
                                high=state.high,
                                stale=state.stale,
                                unit=state.unit,
                                version=state.version,
                            )
                        )
                        # After the state is applied (a fall releases work at once), not before.
                        if update.HasField("forecast"):
                            self._feed_forecast = update.forecast
                        self._refresh_forecast(state)
            except grpc.aio.AioRpcError as error:
                if self.connected and error.code() == grpc.StatusCode.UNAVAILABLE:
                    # A stream that worked and ended (the signal service's connection age, a
                    # replica stopping): routine, resubscribed at once; a warning only if that fails.
                    log.info("signal.resubscribing", extra={"target": self.target, "detail": error.details()})
                elif not warned:
                    log.warning(
                        "signal.unavailable",
                        extra={
                            "target": self.target,
                            "code": error.code().name,
                            "detail": error.details(),
                            "retrying": True,
                        },
                    )
                    warned = True
            finally:
                await channel.close()
            self.connected = False
            await asyncio.sleep(backoff.next_delay())

    def take_stored(self, stored: SignalView) -> None:
        """Takes the state the signal service stored, when it is newer than the one streamed: a
        change it committed (and announced by NOTIFY) but died or froze before streaming still
        holds the work it should, instead of the last value streamed ruling until stale_after."""
        if self.signal is not None and stored.version <= self.signal.version:
            return
        log.info("signal.from_store", extra={"signal": self.signal_name, "version": stored.version})
        self._restart_stale_timer(stored.version)
        self.update(stored)

    def confirmed(self) -> bool:
        """Whether the view may release held work now: confirmed within CONFIRM_WITHIN, and
        by a stored read made after the event loop's latest stall, if it ever stalled."""
        if self._read is None:
            return True
        now = self.watch.look()
        if self._read_at < self.watch.last_stall:
            return False
        return now - max(self._read_at, self._streamed) <= CONFIRM_WITHIN

    async def confirm(self) -> None:
        """Reads the stored state unless the view is confirmed (a hold on needs no confirming:
        it releases nothing), and takes it when newer. Raises DatabaseUnavailable as a claim does."""
        if not (self.state.active or self.confirmed()):
            await self.refresh()

    async def refresh(self) -> None:
        """Reads the stored state and takes it when newer: the view is confirmed as of the
        read's start (after a NOTIFY, or by `confirm`)."""
        if self._read is None:
            return
        began = self.watch.look()
        stored = await self._read(self.signal_name)
        if stored is not None:
            self.take_stored(stored)
        self._read_at = max(self._read_at, began)

    def _refresh_forecast(self, state: signal_pb2.SignalState) -> None:
        """The planner's forecast from the feed's latest (streamed beside the state, only when
        new) and the current value, put in front as a point at `now`, since the feed's points
        start at the next interval. A new version tells the planner to plan again."""
        feed = self._feed_forecast
        now = self._clock()
        actual = state.value if state.HasField("value") else None
        calibration = calibration_of(feed.calibration) if feed is not None and feed.HasField("calibration") else None
        caution, slope, scale = CAUTION, 0.0, 1.0
        if feed is not None and calibration is not None:
            # A bare feed: its points corrected by what the signal's calibration learned, as the
            # carbon bench's `replanned_learned` mode does, with the caution that paid.
            issued = feed.issued_at.ToDatetime(tzinfo=UTC)
            bare = [(p.at.ToDatetime(tzinfo=UTC), p.value) for p in feed.points]
            scale = feed.calibration.lead_scale or 1.0
            points = planning_points(calibration, issued, bare, now=now, actual=actual, scale=scale)
            caution, slope = calibration.caution, calibration.caution_slope
        else:
            # Each point with its expected error, when the feed states one (0: planned on as given).
            given = [] if feed is None else feed.points
            raw = [(p.at.ToDatetime(tzinfo=UTC), p.value, p.expected_error) for p in given]
            # The current value is known: it states no error.
            known = [] if actual is None else [(now, actual, 0.0)]
            points = known + [(at, value, error) for at, value, error in raw if at > now]
        # How much of a point's error the next one shares, as learned (None: not known, as for a feed stating its own).
        shared = shared_error(calibration) if feed is not None and calibration is not None else None
        forecast = Forecast.of(points, error_shared=shared) if len(points) > 1 else None
        if forecast != self.forecast or (caution, slope, scale) != self._caution_learned:
            self.forecast = forecast
            self.forecast_caution, self.forecast_caution_slope, self._lead_scale = caution, slope, scale
            self.forecast_source = feed.source if feed is not None and forecast is not None else ""
            self.forecast_version += 1

    @property
    def _caution_learned(self) -> tuple[float, float, float]:
        return self.forecast_caution, self.forecast_caution_slope, self._lead_scale

    def planning_caution(self) -> float | Callable[[timedelta], float]:
        """The caution to plan with: the same for every task, or by a task's window (the planner
        gives it up to the release lead before the latest start: the whole window is that longer,
        which a replay's speed makes a good part of an hour of its feed's time)."""
        caution, slope, scale = self._caution_learned
        if not slope:
            return caution
        return lambda window: windowed(caution, slope, (window + RELEASE_LEAD) * scale)

    def snapshot(self) -> HoldSnapshot:
        return HoldSnapshot(
            self.signal_name,
            self.forecast,
            not self.state.active,
            self.signal.unit if self.signal is not None else "",
            self.planning_caution(),
            self.forecast_origin,
            self.forecast_source,
        )

    @property
    def forecast_origin(self) -> str:
        """Where the planner's forecast came from: the feed's forecast (source, version, when it
        was issued) with the current value in front."""
        feed = self._feed_forecast
        value = "" if self.signal is None or self.signal.value is None else f", from {self.signal.value:g} now"
        if feed is None or not feed.points:
            return f"no forecast from the feed{value}"
        issued = f" issued {feed.issued_at.ToDatetime().strftime('%H:%M:%S')}Z" if feed.HasField("issued_at") else ""
        origin = f"{feed.source} #{feed.version}{issued}, {len(feed.points)} points{value}"
        if feed.HasField("calibration"):
            learned = feed.calibration
            record = f"learned over {learned.days:.1f} days" if learned.days else "the prior's"
            origin += f"; bias and error {record}, caution {self.forecast_caution:g}"
            if learned.follows and learned.caution_jobs < MIN_JOBS:
                origin += f" (a cold start's: {learned.caution_jobs} of {MIN_JOBS} jobs re-played to choose one)"
            if self.forecast_caution_slope:
                day = windowed(self.forecast_caution, self.forecast_caution_slope, JOB_SLACKS[-1])
                origin += f" (4 h window; {day:.2g} for a window of 24 h, log-linear between)"
            if learned.day_profile:
                share = max(b.profile_share for b in learned.buckets)
                origin += f"; with the feed's day profile (up to {share:.2g} of its change)"
        return origin

    def _restart_stale_timer(self, version: int) -> None:
        """Counts stale_after from the arrival of a new version (a resubscription's first
        message, of a version already seen, does not reset the count)."""
        if self.stale_after is None or version == self._stale_version:
            return
        self._stale_version = version
        self._cancel_stale_timer()
        self._stale_timer = asyncio.get_running_loop().call_later(self.stale_after.total_seconds(), self._mark_stale)

    def _cancel_stale_timer(self) -> None:
        if self._stale_timer is not None:
            self._stale_timer.cancel()
            self._stale_timer = None

    def _mark_stale(self) -> None:
        self._stale_timer = None
        if self.signal is None or self.signal.stale:
            return
        detail = f"no new value from the signal service for {self.stale_after}"
        if self.connected:
            detail += " though the stream is open (a silent connection, or a stopped service)"
        log.warning("signal.stale", extra={"signal": self.signal_name, "detail": detail})
        self.update(dataclasses.replace(self.signal, stale=True))

    def close(self) -> None:
        self._cancel_stale_timer()
        if self._recheck is not None:
            self._recheck.cancel()
        with contextlib.suppress(Exception):
            self._recheck = None
