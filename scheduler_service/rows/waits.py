"""The rows of WaitTask's check."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FinishedTask:
    """A task that has finished."""

    id: int
