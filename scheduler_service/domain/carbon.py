"""The carbon figures per activity type that `GetStatus` shows: how many tasks were dispatched
with a known signal, and the mean signal at their submission against at their dispatch (what
waiting for a lower signal saved). They are kept as totals, counted once per task at its first
dispatch, so that reading them costs the same whatever the history kept."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(slots=True)
class Totals:
    """One type's dispatches counted so far, and the sums of the signal at submit and dispatch."""

    tasks: int = 0
    at_submit: float = 0.0
    at_dispatch: float = 0.0

    def add(self, other: Totals) -> None:
        self.tasks += other.tasks
        self.at_submit += other.at_submit
        self.at_dispatch += other.at_dispatch

    def means(self) -> tuple[float, float]:
        """The mean signal at submit and at dispatch (0 and 0 before any task)."""
        if not self.tasks:
            return (0.0, 0.0)
        return (self.at_submit / self.tasks, self.at_dispatch / self.tasks)


def tally(dispatches: Iterable[tuple[str, int, float | None, float | None]]) -> dict[str, Totals]:
    """The totals per type of these dispatches: (activity type, attempt, signal at submit, at
    dispatch). Only a task's first attempt counts (a retry is the same task again), and only with
    the signal known both when it was submitted and when it was dispatched."""
    out: dict[str, Totals] = {}
    for activity_type, attempt, at_submit, at_dispatch in dispatches:
        if at_submit is None or at_dispatch is None or attempt != 1:
            continue
        totals = out.get(activity_type)
        if totals is None:
            totals = out[activity_type] = Totals()
        totals.tasks += 1
        totals.at_submit += at_submit
        totals.at_dispatch += at_dispatch
    return out


def merged(*parts: Mapping[str, Totals]) -> dict[str, Totals]:
    """The sum of several sets of totals (the database's and a replica's not yet written)."""
    out: dict[str, Totals] = {}
    for part in parts:
        for activity_type, totals in part.items():
            out.setdefault(activity_type, Totals()).add(totals)
    return out
