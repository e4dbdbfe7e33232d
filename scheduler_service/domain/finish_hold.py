"""How long a worker's report may wait for the next group of single submits, whose insert writes it
too (one commit for both instead of two): as long as the submits' pace says the next one is due,
never more than MAX_HOLD, and not at all under a trickle. Pure: the caller gives `now`."""

from __future__ import annotations

from dataclasses import dataclass

# The longest a report waits for a group to take it (seconds). At 100 submits a second one comes
# every 10 ms; a report arrives some 3-5 ms after its own submit, so it waits the rest of a gap.
MAX_HOLD = 0.012
# The least it waits when it waits: under a flow fast enough that the mean gap is next to nothing,
# the next group starts once a writer is free, an insert's time away.
MIN_HOLD = 0.002
# The weight of the newest gap between submits in their running mean.
_WEIGHT = 0.2
# A gap longer than this counts as this long: a pause does not leave a mean that takes many
# submits to come down again.
_LONGEST_GAP = 1.0
# Submits that stopped for this many mean gaps (MIN_HOLD at least) are not waited for.
_STOPPED_AFTER = 3.0


@dataclass
class SubmitPace:
    """The running mean of the gaps between single submits, and when the last one came."""

    last: float | None = None
    gap: float | None = None

    def submitted(self, now: float) -> None:
        if self.last is not None:
            gap = min(max(now - self.last, 0.0), _LONGEST_GAP)
            self.gap = gap if self.gap is None else self.gap + _WEIGHT * (gap - self.gap)
        self.last = now

    def hold(self, now: float) -> float:
        """How long a report that is ready now waits for the next submit (0: it is written now).
        One mean gap (at least MIN_HOLD): submits on a schedule always come within it, random
        ones two times in three; submits rarer than MAX_HOLD, or stopped, are not waited for."""
        if self.last is None or self.gap is None or self.gap > MAX_HOLD:
            return 0.0
        if now - self.last > _STOPPED_AFTER * max(self.gap, MIN_HOLD):
            return 0.0
        return max(self.gap, MIN_HOLD)
