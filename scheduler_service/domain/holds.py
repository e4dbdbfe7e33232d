"""Cost holds: when the signal makes a hold active, and which activity types it holds.

The hold is one input of the claim's skip list (see claim_plan.py); it never changes a task's row.
Everything here is a pure function of the signal as last seen, the configuration and `now`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from lowtide_proto.durations import format_duration


class OnStale(StrEnum):
    HOLD = "hold"
    RELEASE = "release"


@dataclass(frozen=True, slots=True)
class SignalView:
    """The signal as the scheduler last heard it from the signal service."""

    name: str
    value: float | None
    threshold: float
    high: bool
    stale: bool
    unit: str = ""
    version: int = 0


@dataclass(frozen=True, slots=True)
class HoldPolicy:
    # Hysteresis: once active, the hold ends only when the value falls below release_below
    # (when set; otherwise at the threshold) ...
    release_below: float | None = None
    # ... and not before it has lasted min_hold.
    min_hold: timedelta = timedelta(0)
    on_stale: OnStale = OnStale.HOLD


@dataclass(frozen=True, slots=True)
class HoldState:
    active: bool
    since: datetime | None
    reason: str


NO_SIGNAL = "no signal value has arrived yet"
# on_stale = release releases a value that went stale; a scheduler that started during a signal
# outage has no value at all, which holds like any start (high until the first value arrives).
NO_SIGNAL_RELEASE = (
    f"{NO_SIGNAL} (on_stale = release does not apply: it releases a value that went stale, and this "
    "scheduler has had no value since it started)"
)


def initial_hold(policy: HoldPolicy, now: datetime) -> HoldState:
    """The hold of a scheduler that has not heard the signal yet: active, until the first value."""
    return HoldState(True, now, _wanted(None, policy)[1])


def next_hold(previous: HoldState, signal: SignalView | None, policy: HoldPolicy, now: datetime) -> HoldState:
    """The hold after the signal changed (or time passed)."""
    want, reason = _wanted(signal, policy)
    if previous.active and not want and signal is not None and signal.value is not None:
        if policy.release_below is not None and signal.value >= policy.release_below:
            want, reason = True, f"{_show(signal)}, not yet below release_below {policy.release_below:g}"
        elif previous.since is not None and now - previous.since < policy.min_hold:
            want, reason = True, f"the hold has lasted less than min_hold ({format_duration(policy.min_hold)})"
    if want == previous.active:
        return HoldState(want, previous.since, reason)
    return HoldState(want, now, reason)


def _wanted(signal: SignalView | None, policy: HoldPolicy) -> tuple[bool, str]:
    if signal is None or signal.value is None:
        return True, NO_SIGNAL_RELEASE if policy.on_stale is OnStale.RELEASE else NO_SIGNAL
    if signal.stale:
        last = f"the last value of signal {signal.name}, {signal.value:g}{_unit(signal)}, is stale"
        return policy.on_stale is OnStale.HOLD, f"{last} (on_stale = {policy.on_stale.value})"
    if signal.high:
        return True, f"{_show(signal)}, above its threshold of {signal.threshold:g}"
    return False, f"{_show(signal)}, not above its threshold of {signal.threshold:g}"


def _unit(signal: SignalView) -> str:
    return f" {signal.unit}" if signal.unit else ""


def _show(signal: SignalView) -> str:
    return f"signal {signal.name} is {signal.value:g}{_unit(signal)}"


@dataclass(frozen=True, slots=True)
class HoldConfig:
    """Which types a cost hold holds (everywhere, per queue, and per worker), and which signal
    holds them: a type's own (`[types.NAME] signal`), else its queue's (`[queues.NAME] signal`),
    else the default signal."""

    deferrable: frozenset[str] = frozenset()
    per_queue: Mapping[str, frozenset[str]] | None = None
    type_signals: Mapping[str, str] | None = None
    queue_signals: Mapping[str, str] | None = None
    # The signal of each pool's grid (`[pools.NAME] signal`): where a task naming several pools
    # is planned, and what its carbon is counted on when it runs there.
    pool_signals: Mapping[str, str] | None = None

    def for_queue(self, queue: str) -> frozenset[str]:
        extra = (self.per_queue or {}).get(queue, frozenset())
        return self.deferrable | extra

    def signal_for(self, queue: str, activity_type: str, default: str) -> str:
        """The signal whose hold holds `activity_type` on `queue`."""
        return (self.type_signals or {}).get(activity_type) or (self.queue_signals or {}).get(queue) or default

    def signals(self, default: str) -> frozenset[str]:
        """Every signal some work follows or some pool is bound to, the default among them."""
        return frozenset(
            {
                default,
                *(self.type_signals or {}).values(),
                *(self.queue_signals or {}).values(),
                *(self.pool_signals or {}).values(),
            }
        )


def held_types(
    queue: str,
    *,
    hold: HoldState,
    config: HoldConfig,
    worker_deferrable: Iterable[str] = (),
    worker_held: Iterable[str] = (),
) -> frozenset[str]:
    """The activity types a claim on `queue` must skip because of cost.

    worker_deferrable are the worker's own cost-deferrable types (held with the signal);
    worker_held are types the worker holds by its own predicate, whatever the signal says.
    """
    held = frozenset(worker_held)
    if hold.active:
        held |= config.for_queue(queue) | frozenset(worker_deferrable)
    return held


def held_types_by_signal(
    queue: str,
    *,
    holds: Mapping[str, HoldState],
    default: str,
    config: HoldConfig,
    worker_deferrable: Iterable[str] = (),
    worker_held: Iterable[str] = (),
) -> frozenset[str]:
    """`held_types` where each type follows its own signal's hold (`config.signal_for`): a type
    waiting for cheap power is held while the price is high, one waiting for clean power while
    the carbon intensity is. A signal with no hold in `holds` (never heard of) holds its types,
    as a signal holds until its first value arrives."""
    held = set(worker_held)
    for activity_type in config.for_queue(queue) | frozenset(worker_deferrable):
        hold = holds.get(config.signal_for(queue, activity_type, default))
        if hold is None or hold.active:
            held.add(activity_type)
    return frozenset(held)


def local_conflicts(held: Iterable[str], local: Iterable[str]) -> frozenset[str]:
    """Types that are both held and local: a local activity runs inline in its workflow task,
    so no hold can defer it; such a configuration is refused rather than silently ignored."""
    return frozenset(held) & frozenset(local)


def wakeup_route(types: Iterable[str], runnable: Iterable[str], held: frozenset[str]) -> str:
    """What to do with a dispatch reference (a wake-up naming the types of new tasks) for one
    worker: `wake` when some type is runnable and not held, `park` when every runnable type is
    held (recheck after hold_recheck, or release when the signal falls), `ignore` otherwise."""
    mine = frozenset(types) & frozenset(runnable)
    if not mine:
        return "ignore"
    return "park" if mine <= held else "wake"


def max_defer_due(created_at: datetime, max_defer: timedelta | None, now: datetime) -> bool:
    """A held task whose deferral has reached max_defer runs anyway."""
    return max_defer is not None and now - created_at >= max_defer
