"""The cost holds of every signal some work follows: one subscription (a CostHolds) per signal,
and which type on which queue follows which (`HoldConfig.signal_for`). Read as one hold: the
types held on a queue are each type's own signal's, so a type waiting for cheap power and one
waiting for clean power are held and released apart; `state`, `signal` and the forecast without
a type named are the default signal's (`[cost] signal`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from scheduler_service.domain.holds import HoldConfig, HoldState, SignalView, held_types_by_signal
from scheduler_service.domain.planning import Forecast
from scheduler_service.domain.timings import HoldEpisode
from scheduler_service.holds.cost import CostHolds


class SignalHolds:
    def __init__(self, by_signal: Mapping[str, CostHolds], *, default: str, config: HoldConfig) -> None:
        if default not in by_signal:
            raise ValueError(f"no hold for the default signal {default!r}")
        self.by_signal = dict(by_signal)
        self.default = default
        self.config = config

    @property
    def main(self) -> CostHolds:
        return self.by_signal[self.default]

    def following(self, queue: str, activity_type: str) -> CostHolds:
        """The hold of the signal `activity_type` follows on `queue`."""
        return self.by_signal[self.config.signal_for(queue, activity_type, self.default)]

    def held_for(
        self, queue: str, *, worker_deferrable: Iterable[str] = (), worker_held: Iterable[str] = ()
    ) -> frozenset[str]:
        return held_types_by_signal(
            queue,
            holds=self.states(),
            default=self.default,
            config=self.config,
            worker_deferrable=worker_deferrable,
            worker_held=worker_held,
        )

    def states(self) -> dict[str, HoldState]:
        return {name: hold.state for name, hold in self.by_signal.items()}

    def active_on(self, queue: str) -> bool:
        """Whether some signal holds some configured type on `queue` now."""
        return any(self.following(queue, t).state.active for t in self.config.for_queue(queue))

    def types_following(self, name: str) -> list[str]:
        """The configured deferrable types (on any queue) whose hold is signal `name`'s."""
        queues = [None, *(self.config.per_queue or {}), *(self.config.queue_signals or {})]
        found = set()
        for queue in queues:
            types = self.config.deferrable if queue is None else self.config.for_queue(queue)
            found |= {t for t in types if self.config.signal_for(queue or "", t, self.default) == name}
        return sorted(found)

    # The default signal's, as when one signal held everything.
    @property
    def state(self) -> HoldState:
        return self.main.state

    @property
    def signal(self) -> SignalView | None:
        return self.main.signal

    @property
    def signal_name(self) -> str:
        return self.main.signal_name

    @property
    def value(self) -> float | None:
        return self.main.value

    @property
    def last_hold(self) -> HoldEpisode | None:
        return self.main.last_hold

    @property
    def forecast(self) -> Forecast | None:
        return self.main.forecast

    @property
    def forecast_origin(self) -> str:
        return self.main.forecast_origin

    @property
    def forecast_source(self) -> str:
        return self.main.forecast_source

    @property
    def forecast_version(self) -> int:
        """Moves whenever any signal's forecast does, so the planner plans again."""
        return sum(hold.forecast_version for hold in self.by_signal.values())

    def take_stored(self, stored: SignalView) -> None:
        """A signal's stored state, read after its NOTIFY (see CostHolds.take_stored)."""
        hold = self.by_signal.get(stored.name)
        if hold is not None:
            hold.take_stored(stored)

    async def run(self) -> None:
        """Every signal's subscription, each resubscribing on its own."""
        await asyncio.gather(*(hold.run() for hold in self.by_signal.values()))

    def close(self) -> None:
        for hold in self.by_signal.values():
            hold.close()
