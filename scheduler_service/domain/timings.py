"""What the task histograms record of an attempt the dispatcher sends, and the label cap.

Pure: the times come from the claimed row (the database's clock for when the task was created,
became due and started) and from the cost hold's last episode (the scheduler's clock).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol

OTHER = "other"
COST_HOLD = "cost_hold"
PLANNED_RELEASE = "planned_release"


@dataclass(frozen=True, slots=True)
class HoldEpisode:
    """The cost hold's latest episode: when it began, and when it ended (None: still active)."""

    began: datetime
    ended: datetime | None


class Due(Protocol):
    """What a claimed row says of an attempt's timing (the claim's RETURNING has these columns)."""

    # When the attempt became due: its submission, the end of its backoff, its dependencies'
    # end, its fixed start or its planned release.
    @property
    def run_at(self) -> datetime: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def released_by(self) -> str | None: ...
    @property
    def hold_deadline(self) -> datetime | None: ...
    # A first attempt's submission when a planned release held it (its run_at is the release).
    @property
    def planned_since(self) -> datetime | None: ...


class Timings(NamedTuple):
    """In seconds: due → started, claimable → sent, and how long a hold held it (with which)."""

    queue_wait: float
    dispatch_latency: float
    held: tuple[str, float] | None
    # When that hold began and released it (the task's task.held span), with `held`.
    held_between: tuple[datetime, datetime] | None = None


def _seconds(later: datetime, earlier: datetime) -> float:
    return max(0.0, (later - earlier).total_seconds())


def timings(row: Due, *, deferrable: bool, sent_at: datetime, episode: HoldEpisode | None) -> Timings:
    """Queue wait runs from when the attempt became due to its start (a cost hold's wait
    included: the task was due); dispatch latency from when it became claimable (due, and no
    hold on it any more) to the assignment's send. Time held is counted once, at the release:
    a first attempt released at its planned release waited from its submission; one a cost hold
    held waited from its due time (or the hold's start, if later) to the hold's end (or to its own
    deadline, `max_defer`). A task held through several episodes counts the last one only.
    `deferrable`: a cost hold holds its type on its queue (configured, or by the worker it was
    sent to)."""
    claimable = row.run_at
    reason, began = None, row.run_at
    if row.planned_since is not None:
        reason, began = PLANNED_RELEASE, row.planned_since
    elif deferrable and row.released_by == "max_defer":
        claimable = max(row.run_at, row.hold_deadline or row.run_at)
        reason, began = COST_HOLD, row.run_at if episode is None else max(row.run_at, episode.began)
    elif deferrable and episode is not None and episode.ended is not None and episode.ended > row.run_at:
        claimable = episode.ended
        reason, began = COST_HOLD, max(row.run_at, episode.began)
    return Timings(
        queue_wait=_seconds(row.started_at, row.run_at),
        dispatch_latency=_seconds(sent_at, claimable),
        held=None if reason is None else (reason, _seconds(claimable, began)),
        held_between=None if reason is None else (began, max(began, claimable)),
    )


class LabelCap:
    """Bounds a label's values: the configured ones, then the first `limit` others seen; every
    later value is `other`. Activity types and queues are strings submitters choose, and each
    distinct value is a time series per bucket: without a cap a typo-per-task submitter grows a
    Prometheus server without bound."""

    def __init__(self, known: Iterable[str], limit: int) -> None:
        self._known = frozenset(known)
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._known or value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OTHER
