"""The auction that shares a small pool: never more runs in a slot than it has room for, and for
tasks of one slot each, within (tasks x epsilon) of the cheapest assignment (checked against
every assignment there is)."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler_service.domain.assignment import Bidder, auction

EPSILON = 0.01


@st.composite
def instances(draw: st.DrawFn, *, spans: bool = False) -> tuple[list[Bidder], list[int]]:
    slots = draw(st.integers(1, 5))
    room = draw(st.lists(st.integers(0, 2), min_size=slots, max_size=slots))
    bidders = []
    for key in range(draw(st.integers(1, 5))):
        options = []
        for first in sorted(draw(st.sets(st.integers(0, slots - 1), min_size=1, max_size=slots))):
            length = draw(st.integers(1, 2)) if spans else 1
            options.append((float(draw(st.integers(0, 100))), range(first, min(slots, first + length))))
        bidders.append(Bidder(key, options, droppable=spans and draw(st.booleans())))
    return bidders, room


def used(bidders: list[Bidder], got: dict[int, int]) -> Counter[int]:
    return Counter(i for b in bidders if b.key in got for i in b.options[got[b.key]][1])


# Found by hypothesis: tasks with a single start raised its price by epsilon alone, and the
# price war with a task that had another start 50 dearer ran out of bids.
PRICE_WAR = (
    [
        Bidder(0, [(0.0, range(0, 1))]),
        Bidder(1, [(0.0, range(0, 1))]),
        Bidder(2, [(0.0, range(1, 2))]),
        Bidder(3, [(0.0, range(0, 1)), (0.0, range(1, 2)), (0.0, range(2, 3))]),
        Bidder(4, [(0.0, range(0, 1)), (0.0, range(1, 2)), (50.0, range(2, 3))]),
    ],
    [2, 1, 2],
)


@settings(max_examples=300)
@given(instances())
@example(PRICE_WAR)
def test_one_slot_tasks_get_the_cheapest_assignment_within_epsilon(instance: tuple[list[Bidder], list[int]]) -> None:
    bidders, room = instance
    best = None
    for choice in itertools.product(*(range(len(b.options)) for b in bidders)):
        counts = Counter(b.options[c][1].start for b, c in zip(bidders, choice, strict=True))
        if all(n <= room[i] for i, n in counts.items()):
            total = sum(b.options[c][0] for b, c in zip(bidders, choice, strict=True))
            best = total if best is None else min(best, total)
    got = auction(bidders, room, EPSILON, max_bids=10_000)
    assert all(n <= room[i] for i, n in used(bidders, got).items())
    if best is None:
        return  # no assignment has room for every task: some are left without
    assert len(got) == len(bidders)
    total = sum(b.options[got[b.key]][0] for b in bidders)
    assert total <= best + len(bidders) * EPSILON + 1e-9


@settings(max_examples=300)
@given(instances(spans=True), st.integers(0, 40))
def test_never_more_runs_in_a_slot_than_its_room(instance: tuple[list[Bidder], list[int]], max_bids: int) -> None:
    bidders, room = instance
    got = auction(bidders, room, EPSILON, max_bids=max_bids)
    assert all(n <= room[i] for i, n in used(bidders, got).items())
    assert set(got) <= {b.key for b in bidders}


def test_the_task_that_loses_least_by_moving_moves() -> None:
    # One unit of room at slot 0. Task 1 would lose 50 by moving (to slot 1), task 2 only 10.
    bidders = [
        Bidder(1, [(0.0, range(0, 1)), (50.0, range(1, 2))]),
        Bidder(2, [(0.0, range(0, 1)), (10.0, range(2, 3))]),
    ]
    assert auction(bidders, [1, 1, 1], EPSILON, max_bids=1000) == {1: 0, 2: 1}
    # Expected work is left out rather than kept above its dearest start.
    coming = Bidder(3, [(0.0, range(0, 1))], droppable=True)
    assert auction([*bidders, coming], [1, 1, 1], EPSILON, max_bids=1000) == {1: 0, 2: 1}
