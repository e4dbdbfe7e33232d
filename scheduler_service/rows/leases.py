"""The rows of the workers' lease renewal."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RenewedWorker:
    """A worker whose lease a renewal extended."""

    id: str


@dataclass(frozen=True, slots=True)
class LeaderCheck:
    """What the maintenance loop learns each tick: whether this replica leads, and whether another
    replica runs."""

    leading: bool
    others: bool
