"""Jittered exponential backoff shared by the client's retries, the worker's reconnects and every
retry or reconnect loop of the services.

Many workers and clients lose the same scheduler at the same moment (a deploy, a failover).
Without jitter they would all come back in lockstep and hammer it; each delay is therefore
drawn uniformly from the upper half of the current step, which spreads them out while never
retrying much sooner than planned.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays that start at ``initial`` seconds and double up to ``maximum`` seconds."""

    def __init__(self, *, initial: float, maximum: float, factor: float = 2.0) -> None:
        if initial <= 0 or maximum < initial or factor < 1:
            raise ValueError("backoff needs 0 < initial <= maximum and factor >= 1")
        self._initial = initial
        self._maximum = maximum
        self._factor = factor
        self._step = initial

    def next_delay(self) -> float:
        """The delay to sleep before the next try; each call moves one step further."""
        step = self._step
        self._step = min(self._step * self._factor, self._maximum)
        return random.uniform(step / 2, step)

    def cap(self, maximum: float) -> None:
        """Lower (or raise) the longest delay; never below ``initial``."""
        self._maximum = max(self._initial, maximum)
        self._step = min(self._step, self._maximum)

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self._step = self._initial
