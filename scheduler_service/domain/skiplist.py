"""The claim's skip list: activity types a claim must not take right now.

One mechanism, two sources, as in the seed: types at their concurrency limit (skipped outright)
and types a cost hold holds (skipped except for workflow tasks, which are never held, and tasks
past their max_defer). The plan also caps each limited type at its remaining room, so one batch
never overshoots a limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Pair = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """What one claim may take: (queue, type, cap) pairs, open ones and held ones."""

    open: tuple[Pair, ...]
    held: tuple[Pair, ...]
    at_limit: frozenset[str]

    @property
    def empty(self) -> bool:
        return not any(cap for _, _, cap in self.open + self.held)


def at_limit(limits: Mapping[str, int], running: Mapping[str, int]) -> frozenset[str]:
    return frozenset(t for t, limit in limits.items() if running.get(t, 0) >= limit)


def plan_claim(
    queues: Iterable[str],
    worker_types: Iterable[str],
    batch: int,
    *,
    limits: Mapping[str, int],
    running: Mapping[str, int],
    held: Mapping[str, frozenset[str]] | None = None,
) -> ClaimPlan:
    """held maps a queue to the types a cost hold holds on it now."""
    full = at_limit(limits, running)
    open_pairs: list[Pair] = []
    held_pairs: list[Pair] = []
    for queue in sorted(set(queues)):
        held_here = (held or {}).get(queue, frozenset())
        for name in sorted(set(worker_types)):
            if name in full:
                continue
            room = limits[name] - running.get(name, 0) if name in limits else batch
            pair = (queue, name, max(0, min(batch, room)))
            (held_pairs if name in held_here else open_pairs).append(pair)
    return ClaimPlan(tuple(open_pairs), tuple(held_pairs), full)
