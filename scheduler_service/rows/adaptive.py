"""The rows of adaptive concurrency: a type's stored limit (lowtide.adaptive_limits)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class LimitRow:
    activity_type: str
    limit_value: float
    baseline_ms: float | None
    baseline_at: datetime | None
    slow_start: bool
    latency_ms: float | None
    failure_rate: float
    samples: int
    reason: str
    updated_at: datetime
