"""Central dispatch: who may share a claim, and how its rows are handed out.

A replica claims for groups of sessions, not for each worker: the sessions that may run exactly
the same work (same pool, queues and activity types, and the same types held for them) share one
claim up to their free slots. The rows it takes go to the slots in the order `hand_out` gives,
so no worker of a group is starved by another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class GroupKey:
    """What a session may run: sessions with equal keys share every claim."""

    pool: str
    queues: tuple[str, ...]
    activity_types: tuple[str, ...]
    # The worker's own cost-deferrable types (held with the signal) and the types it holds by its
    # own predicate: both change what the hold takes out of a claim.
    cost_deferrable: frozenset[str]
    predicate_held: frozenset[str]


def rotated(free: Sequence[tuple[str, int]], start: int = 0) -> list[tuple[str, int]]:
    """The workers with a free slot, from the `start`-th on (and round): the order `hand_out`
    gives each turn. A claim passes its slots in this order (`take_slots`), not one entry per
    slot; the SQL expands them the same way (sql/claims.sql, _claim_slots)."""
    live = [(worker, slots) for worker, slots in free if slots > 0]
    if not live:
        return []
    offset = start % len(live)
    return live[offset:] + live[:offset]


def take_slots(
    workers: Sequence[W], free: Callable[[W], int], start: int, most: int
) -> tuple[list[tuple[W, int]], int]:
    """A claim's slots: the workers with a free slot from the `start`-th on (and round), each with
    its free count, until `most` slots are taken (the last one's count cut to fit); and where the
    next claim starts. A claim that stopped at `most` is followed by one starting past the last
    worker it looked at, so bounded claims take turns over a large group; one that looked at every
    worker, by one starting a worker further on (the hand-out's rotation). Only the workers looked
    at are asked for their free slots: a claim costs its slots, not the size of its group."""
    count = len(workers)
    if count == 0 or most <= 0:
        return [], start
    offset = start % count
    taken: list[tuple[W, int]] = []
    total = looked = 0
    while looked < count and total < most:
        worker = workers[(offset + looked) % count]
        looked += 1
        slots = free(worker)
        if slots > 0:
            slots = min(slots, most - total)
            taken.append((worker, slots))
            total += slots
    return taken, (offset + (looked if looked < count else 1)) % count


def hand_out(free: Sequence[tuple[str, int]], start: int = 0) -> list[str]:
    """The owner of each slot in the order a claim's rows fill them: one slot of every worker in
    turn (from the `start`-th, so that rotating it spreads ties over rounds) while each has one
    free. The first n rows of a claim therefore go to n different workers whenever n workers have
    a free slot, and a worker with more free slots gets its extra rows only after every other
    worker had its share.

    `free` lists (worker id, free slots); workers with none are left out."""
    order = rotated(free, start)
    if not order:
        return []
    owners: list[str] = []
    most = max(slots for _, slots in order)
    for turn in range(most):
        owners.extend(worker for worker, slots in order if slots > turn)
    return owners
