"""The rows of the workers' lease renewal."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RenewedWorker:
    """A worker whose lease a renewal extended."""

    id: str
