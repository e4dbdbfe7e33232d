"""The cost holds of every signal some work follows: one subscription (a CostHolds) per signal,
and which type on which queue follows which (`HoldConfig.signal_for`). Read as one hold: the
types held on a queue are each type's own signal's, so a type waiting for cheap power and one
waiting for clean power are held and released apart; `state`, `signal` and the forecast without
a type named are the default signal's (`[cost] signal`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from scheduler_service.domain.holds import HoldConfig, HoldState, SignalView, held_types_by_signal
from scheduler_service.domain.model import NewTask
from scheduler_service.domain.planning import Forecast
from scheduler_service.domain.timings import HoldEpisode
from scheduler_service.holds.cost import CostHolds, LoopWatch
from scheduler_service.holds.snapshot import HoldSnapshot
from scheduler_service.rows.fleet import StoredSignal
from scheduler_service.store import Store

UNCONFIRMED = "the signal's last value is not confirmed yet (read again before held work is released)"


@dataclass(frozen=True, slots=True)
class HoldsSnapshot:
    """Every signal's hold as a plan reads it, as of one moment (CostHolds.snapshot)."""

    by_signal: Mapping[str, HoldSnapshot]
    default: str
    config: HoldConfig

    def following(self, queue: str, activity_type: str) -> HoldSnapshot:
        return self.by_signal[self.config.signal_for(queue, activity_type, self.default)]


class SignalHolds:
    def __init__(
        self, by_signal: Mapping[str, CostHolds], *, default: str, config: HoldConfig, watch: LoopWatch | None = None
    ) -> None:
        if default not in by_signal:
            raise ValueError(f"no hold for the default signal {default!r}")
        self.by_signal = dict(by_signal)
        self.default = default
        self.config = config
        # The event loop's watch the holds share (a stall makes every view unconfirmed).
        self.watch = watch or LoopWatch()

    @property
    def main(self) -> CostHolds:
        return self.by_signal[self.default]

    def following(self, queue: str, activity_type: str) -> CostHolds:
        """The hold of the signal `activity_type` follows on `queue`."""
        return self.by_signal[self.config.signal_for(queue, activity_type, self.default)]

    def snapshot(self) -> HoldsSnapshot:
        return HoldsSnapshot(
            {name: hold.snapshot() for name, hold in self.by_signal.items()}, self.default, self.config
        )

    def own_signal(self, pool: str) -> bool:
        """Whether the pool is bound to a signal other than the default one."""
        name = (self.config.pool_signals or {}).get(pool)
        return name is not None and name != self.default and name in self.by_signal

    def value_in(self, pool: str) -> float | None:
        """The signal value where the pool's work runs: its own grid's (`[pools.NAME] signal`),
        else the default signal's; what a task dispatched there records (signal_at_dispatch)."""
        name = (self.config.pool_signals or {}).get(pool)
        hold = self.by_signal.get(name) if name else None
        return (hold or self.main).value

    def values_at_submit(self, tasks: Iterable[NewTask]) -> list[float | None]:
        """What each task records as the signal at its submission (signal_at_submit): the
        default signal's value, and for a task naming pools the lowest of their values now
        (value_in): running at once in the cleanest pool it may run in is what its carbon is
        counted against, not the default signal's grid (None while none of them has a value)."""
        default = self.main.value
        out: list[float | None] = []
        for task in tasks:
            if not task.pools:
                out.append(default)
                continue
            known = [v for v in map(self.value_in, task.pools) if v is not None]
            out.append(min(known, default=None))
        return out

    def held_for(
        self,
        queue: str,
        *,
        worker_deferrable: Iterable[str] = (),
        worker_held: Iterable[str] = (),
        confirmed: bool = False,
    ) -> frozenset[str]:
        """The types held on `queue`; with `confirmed`, also those whose signal's view is not
        confirmed (what may start now, as opposed to what to wake or park for)."""
        return held_types_by_signal(
            queue,
            holds=self.confirmed_states() if confirmed else self.states(),
            default=self.default,
            config=self.config,
            worker_deferrable=worker_deferrable,
            worker_held=worker_held,
        )

    def states(self) -> dict[str, HoldState]:
        return {name: hold.state for name, hold in self.by_signal.items()}

    def confirmed_states(self) -> dict[str, HoldState]:
        """Each signal's hold, on for a view not confirmed (CostHolds.confirmed)."""
        return {
            name: hold.state if hold.state.active or hold.confirmed() else HoldState(True, None, UNCONFIRMED)
            for name, hold in self.by_signal.items()
        }

    def signals_of(self, queues: Iterable[str], types: Collection[str], worker_deferrable: Iterable[str]) -> set[str]:
        """The signals whose holds hold some of `types` on `queues`."""
        extra = frozenset(worker_deferrable)
        return {
            self.config.signal_for(queue, t, self.default)
            for queue in queues
            for t in (self.config.for_queue(queue) | extra) & frozenset(types)
        }

    async def confirm(self, names: Iterable[str]) -> None:
        """Confirms each named signal's view, reading its stored row where needed, before a claim
        that may start the types it holds (CostHolds.confirm)."""
        for name in sorted(set(names)):
            hold = self.by_signal.get(name)
            if hold is not None:
                await hold.confirm()

    async def refresh(self, name: str) -> None:
        """Reads signal `name`'s stored state after its NOTIFY (CostHolds.refresh)."""
        hold = self.by_signal.get(name)
        if hold is not None:
            await hold.refresh()

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

    async def run(self) -> None:
        """Every signal's subscription, each resubscribing on its own, and the loop's watch."""
        await asyncio.gather(self.watch.run(), *(hold.run() for hold in self.by_signal.values()))

    def close(self) -> None:
        for hold in self.by_signal.values():
            hold.close()


def stored_reader(store: Store) -> Callable[[str], Awaitable[SignalView | None]]:
    """A signal's state as the signal service stored it, by name, as the stream would carry it."""

    async def read(name: str) -> SignalView | None:
        stored = await store.stored_signal(name)
        return None if stored is None else signal_view(stored)

    return read


def signal_view(stored: StoredSignal) -> SignalView:
    """A stored signal state as the stream would carry it: high while over its threshold or
    until its first value (the signal service's rule, signal_service.domain.is_high)."""
    high = stored.value is None or stored.value > stored.threshold
    return SignalView(stored.name, stored.value, stored.threshold, high, stored.stale, stored.unit, stored.version)
