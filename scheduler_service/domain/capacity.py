"""Desired capacity: how many workers a pool should have now.

Enough slots for the claimable backlog and what runs, plus one slot per reservation starting
within the autoscale horizon — so an autoscaled pool grows before a fixed start needs its hold.
Held work (a cost hold) is not counted: it waits for a cheaper window, not for capacity.
"""

from __future__ import annotations

import math


def desired_workers(
    *,
    claimable: int,
    running: int,
    slots_per_worker: int,
    reserved: int = 0,
    min_workers: int = 0,
    max_workers: int | None = None,
) -> int:
    slots = max(1, slots_per_worker)
    wanted = math.ceil(max(0, claimable + running + reserved) / slots)
    wanted = max(min_workers, wanted)
    return wanted if max_workers is None else min(max_workers, wanted)
