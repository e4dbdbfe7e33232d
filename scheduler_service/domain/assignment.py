"""Which task gets which room when a pool is too small for every task in its cheapest window:
an auction (Bertsekas' forward auction for the assignment problem), so that the tasks that lose
least by moving are the ones that move.

Why it works this way: docs/architecture/holds.md.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bidder:
    key: int
    # (score, slots) of each start it may take.
    options: Sequence[tuple[float, range]]
    droppable: bool = False


def auction(bidders: Sequence[Bidder], room: Sequence[int], epsilon: float, max_bids: int) -> dict[int, int]:
    """The option (index into `options`) each bidder got, by key; a bidder left out or still
    bidding when `max_bids` ran out is missing."""
    # Each slot's units as a heap of (price, unit): the cheapest first, of equal prices the
    # lowest unit (a list searched for its minimum at every bid cost a pool of 800 slots 4 s).
    prices = [[(0.0, unit) for unit in range(max(0, n))] for n in room]
    # The cheapest unit's price in each slot (inf: no room at all).
    floor = [0.0 if n > 0 else math.inf for n in room]
    holders: list[list[int | None]] = [[None] * max(0, n) for n in room]
    by_key = {b.key: b for b in bidders}
    # Expected work is worth no more to keep than the dearest start it has.
    drops = {b.key: max(score for score, _ in b.options) + epsilon for b in bidders if b.droppable and b.options}
    held: dict[int, tuple[int, list[tuple[int, int]]]] = {}
    # What a bidder with a single start (no second best) raises its units by: more than any
    # other bidder can gain by staying there rather than moving (the spread of all scores), so
    # those who can move do so at once. Raising by epsilon alone started a price war that took
    # (spread / epsilon) bids to settle, and ran out of bids with room left for everyone.
    scores = [score for b in bidders for score, _ in b.options]
    spread = max(scores) - min(scores) if scores else 0.0
    single = (spread if math.isfinite(spread) else 0.0) + epsilon
    waiting = deque(b for b in bidders if b.options)
    bids = 0
    while waiting and bids < max_bids:
        bidder = waiting.popleft()
        best, second, chosen = math.inf, math.inf, -1
        for index, (score, slots) in enumerate(bidder.options):
            cost = score
            for i in slots:
                cost += floor[i]
            if cost < best:
                best, second, chosen = cost, best, index
            elif cost < second:
                second = cost
        drop = drops.get(bidder.key)
        if drop is not None:
            if best > drop:
                continue
            second = min(second, drop)
        if best == math.inf:
            continue
        bids += 1
        slots = bidder.options[chosen][1]
        rise = (second - best if second < math.inf else single) + epsilon
        units = []
        for i in slots:
            here = prices[i]
            price, unit = here[0]
            outbid = holders[i][unit]
            if outbid is not None:
                _release(held.pop(outbid)[1], holders)
                waiting.append(by_key[outbid])
            holders[i][unit] = bidder.key
            heapq.heapreplace(here, (price + rise / len(slots), unit))
            floor[i] = here[0][0]
            units.append((i, unit))
        held[bidder.key] = (chosen, units)
    return {key: option for key, (option, _) in held.items()}


def _release(units: list[tuple[int, int]], holders: list[list[int | None]]) -> None:
    for i, unit in units:
        holders[i][unit] = None
