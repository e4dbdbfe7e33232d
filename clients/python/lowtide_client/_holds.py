"""Worker-side cost holds: any ``() -> bool`` is a signal source.

A ``CostHold(predicate, types)`` holds ``types`` while ``predicate()`` is true. The worker
evaluates its holds as it connects (its Hello names the held set, so the scheduler's first
claim for the stream already leaves them out) and every ``hold_check_interval`` after that,
telling the scheduler on its stream whenever the held set changes; the scheduler then claims
none of those types for this worker. A claim made before a change arrived still runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["CostHold", "held_now", "local_conflicts"]


@dataclass(frozen=True)
class CostHold:
    predicate: Callable[[], bool]
    types: Sequence[str]

    def __post_init__(self) -> None:
        if isinstance(self.types, str):
            raise TypeError("CostHold types must be a sequence of activity type names, not a single str")


def held_now(holds: Iterable[CostHold]) -> frozenset[str]:
    """The types held right now. A predicate that raises holds its types: when in doubt, wait."""
    held: set[str] = set()
    for hold in holds:
        try:
            active = bool(hold.predicate())
        except Exception:
            active = True
        if active:
            held.update(hold.types)
    return frozenset(held)


def local_conflicts(held: Iterable[str], local: Iterable[str]) -> frozenset[str]:
    return frozenset(held) & frozenset(local)
