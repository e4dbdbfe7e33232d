"""When the scheduler's view of the cost signal may release held work: confirmed by the stream or
a stored read within CONFIRM_WITHIN, and after the event loop stalled only by a stored read made
after the stall (holds/cost.py)."""

from __future__ import annotations

from scheduler_service.domain.holds import HoldConfig, HoldPolicy, SignalView
from scheduler_service.holds.cost import CONFIRM_WITHIN, STALL, CostHolds, LoopWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def view(value: float, version: int) -> SignalView:
    return SignalView("grid", value, 200.0, value > 200.0, False, "", version)


def holds_reading(stored: list[SignalView], clock: Clock) -> tuple[CostHolds, list[str]]:
    reads: list[str] = []

    async def read(name: str) -> SignalView | None:
        reads.append(name)
        return stored[-1]

    holds = CostHolds(
        target="unused",
        signal="grid",
        policy=HoldPolicy(),
        config=HoldConfig(frozenset({"defer"})),
        on_release=lambda: None,
        read=read,
        watch=LoopWatch(clock),
    )
    return holds, reads


async def test_a_view_older_than_its_bound_is_read_again_before_it_releases_work() -> None:
    clock = Clock()
    stored = [view(100, 1)]
    holds, reads = holds_reading(stored, clock)
    await holds.refresh()
    assert not holds.state.active and holds.confirmed()
    await holds.confirm()
    assert reads == ["grid"], "a confirmed view is not read again"

    for _ in range(int(CONFIRM_WITHIN / (STALL / 2)) + 1):  # time passes, the loop ticking
        clock.now += STALL / 2
        holds.watch.look()
    assert not holds.confirmed()
    stored.append(view(300, 2))
    await holds.confirm()
    assert reads == ["grid", "grid"]
    assert holds.state.active and holds.value == 300


async def test_after_a_stall_only_a_stored_read_confirms_the_view() -> None:
    clock = Clock()
    stored = [view(100, 1)]
    holds, reads = holds_reading(stored, clock)
    await holds.refresh()
    clock.now += STALL + 0.5  # frozen: no tick
    assert not holds.confirmed(), "a view from before a stall releases nothing"
    # What the stream delivers after the stall may be old news (newer values queued behind it).
    holds._streamed = holds.watch.look()
    assert not holds.confirmed()
    stored.append(view(300, 3))
    await holds.confirm()
    assert holds.state.active and holds.value == 300 and holds.confirmed()
    assert reads == ["grid", "grid"]


async def test_a_hold_on_needs_no_confirming() -> None:
    clock = Clock()
    stored = [view(300, 1)]
    holds, reads = holds_reading(stored, clock)
    await holds.refresh()
    clock.now += 10 * CONFIRM_WITHIN
    await holds.confirm()
    assert holds.state.active and reads == ["grid"]
