"""The fault schedule, drawn from the seed alone: the same seed, duration and targets give the
same faults at the same offsets, so a failing soak is replayed by running it again."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# (kind, target class, weight, shortest and longest outage in seconds). A kill is undone by a
# restart after the outage; a stop (SIGSTOP) by SIGCONT; a cut (every worker connection reset)
# is over at once. Outages beyond the lease (10 s) make a frozen process lose its work.
KINDS: tuple[tuple[str, str, float, float, float], ...] = (
    ("kill", "scheduler", 3.0, 1.0, 8.0),
    ("stop", "scheduler", 2.0, 1.0, 15.0),
    ("kill", "worker", 4.0, 0.5, 5.0),
    ("stop", "worker", 2.0, 1.0, 15.0),
    ("cut", "workers", 3.0, 0.0, 0.0),
    ("kill", "signal", 1.0, 1.0, 8.0),
    ("stop", "signal", 1.0, 1.0, 10.0),
    ("kill", "postgres", 1.5, 1.0, 10.0),
    ("stop", "postgres", 1.0, 1.0, 8.0),
)


@dataclass(frozen=True, slots=True)
class PlannedFault:
    at: float  # seconds from the start of the faults
    kind: str
    target: str
    outage: float

    def __str__(self) -> str:
        outage = f" for {self.outage:.1f} s" if self.kind != "cut" else ""
        return f"+{self.at:7.1f} s  {self.kind:<4} {self.target}{outage}"


def plan_faults(
    seed: int, duration: float, *, mean_gap: float, schedulers: Sequence[str], workers: Sequence[str]
) -> list[PlannedFault]:
    """Faults at exponentially spaced offsets (mean `mean_gap`) within `duration`, each a kind and
    a target drawn by weight, from `random.Random(seed)` only."""
    rng = random.Random(seed)
    targets = {"scheduler": list(schedulers), "worker": list(workers), "workers": ["workers"]}
    targets["signal"], targets["postgres"] = ["signal"], ["postgres"]
    weights = [w for _, _, w, _, _ in KINDS]
    planned = []
    at = rng.expovariate(1 / mean_gap)
    while at < duration:
        kind, group, _, shortest, longest = rng.choices(KINDS, weights)[0]
        target = rng.choice(targets[group])
        outage = round(rng.uniform(shortest, longest), 1)
        planned.append(PlannedFault(round(at, 1), kind, target, outage))
        at += rng.expovariate(1 / mean_gap)
    return planned
