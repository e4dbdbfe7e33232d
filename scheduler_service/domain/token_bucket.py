"""How often a worker may send the messages that can each start a claim for its group (a
SlotUpdate or a HoldUpdate, which cost the worker a few bytes and the database a statement): a
token bucket per stream, refilled at `rate` a second up to `burst`. The libraries send them a few
times a second at most (a HoldUpdate when a hold changes, checked every 250 ms; a SlotUpdate when
stopping); a stream that sends them faster is ended rather than let one worker keep the database
busy with claims."""

from __future__ import annotations

from dataclasses import dataclass, field

# Per stream: a second's worth at this rate, and up to twice that in a burst.
RATE = 50.0
BURST = 100.0


@dataclass(slots=True)
class TokenBucket:
    rate: float = RATE
    burst: float = BURST
    tokens: float = field(init=False)
    # When the tokens were last counted (a monotonic clock, seconds); None before the first take.
    at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self, now: float) -> bool:
        """Spends one message of the bucket at `now`; False when none is left."""
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
