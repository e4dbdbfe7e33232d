"""The claim's skip list: activity types a claim must not take right now.

One mechanism, several sources (as in the seed): types at their concurrency limit now, and (with
cost holds) held types. The claim also caps each limited type at its remaining room, so one batch
never overshoots a limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """The types one claim may take, each with the most it may take in this batch."""

    types: tuple[str, ...]
    caps: tuple[int, ...]
    skipped: frozenset[str]

    @property
    def empty(self) -> bool:
        return not self.types


def at_limit(limits: Mapping[str, int], running: Mapping[str, int]) -> frozenset[str]:
    return frozenset(t for t, limit in limits.items() if running.get(t, 0) >= limit)


def plan_claim(
    worker_types: Iterable[str],
    batch: int,
    *,
    limits: Mapping[str, int],
    running: Mapping[str, int],
    held: Iterable[str] = (),
) -> ClaimPlan:
    skipped = at_limit(limits, running) | frozenset(held)
    types: list[str] = []
    caps: list[int] = []
    for name in sorted(set(worker_types)):
        if name in skipped:
            continue
        room = limits[name] - running.get(name, 0) if name in limits else batch
        types.append(name)
        caps.append(max(0, min(batch, room)))
    return ClaimPlan(tuple(types), tuple(caps), skipped)
