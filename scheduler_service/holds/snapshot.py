"""What a plan reads of a signal's hold (scheduler_service.holds.cost keeps the hold)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from scheduler_service.domain.planning import Forecast


@dataclass(frozen=True, slots=True)
class HoldSnapshot:
    """What a plan reads of a signal's hold, as of one moment on the event loop: the leader plans
    in a thread while the signal's stream goes on changing the hold."""

    signal_name: str
    forecast: Forecast | None
    signal_low: bool
    unit: str
    # planning_caution(): the caution learned, the same for every task or by a task's window.
    planning_caution: float | Callable[[timedelta], float]
    origin: str
    source: str
