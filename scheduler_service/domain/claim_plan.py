"""The claim's skip list: activity types a claim must not take right now.

One mechanism, three sources: types at their static concurrency limit (`max_concurrency`) or at
their adaptive limit (`adaptive_concurrency`, both skipped outright), and types a cost hold holds
(skipped except for workflow tasks, which are never held, and tasks past their max_defer). The
claim takes one limit per type, the lower of the two; the plan caps each limited type at its
remaining room, so one batch never overshoots a limit. `skip_sources` names which source keeps a
type out, for `explain`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

Pair = tuple[str, str, int]


class Source(StrEnum):
    """Why a type is in the skip list (the codes `explain` gives)."""

    STATIC_LIMIT = "concurrency_limit"
    ADAPTIVE_LIMIT = "adaptive_limit"
    COST_HOLD = "cost_hold"


def effective_limits(static: Mapping[str, int], adaptive: Mapping[str, int]) -> dict[str, int]:
    """The one limit per type the claim applies: the lower of its static and adaptive limits."""
    limits = dict(static)
    for name, limit in adaptive.items():
        limits[name] = min(limit, limits.get(name, limit))
    return limits


def skip_sources(
    name: str,
    *,
    static: Mapping[str, int],
    adaptive: Mapping[str, int],
    running: int,
    held: bool,
) -> tuple[Source, ...]:
    """The sources that keep `name` out of claims now, most decisive first: a cost-held type is
    held whatever its limits, and at a limit it is the lower limit that binds."""
    sources: list[Source] = [Source.COST_HOLD] if held else []
    limits = [(static[name], Source.STATIC_LIMIT)] if name in static else []
    if name in adaptive:
        limits.append((adaptive[name], Source.ADAPTIVE_LIMIT))
    sources.extend(source for limit, source in sorted(limits, key=lambda x: x[0]) if running >= limit)
    return tuple(sources)


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
