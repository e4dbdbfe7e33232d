"""Submission decisions: idempotency, dependencies, overload. Pure functions of a batch and what is stored.

The submission use case (tasks/submission.py) reads what these need inside one
transaction, asks them, and writes what they decide.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler_service.domain.model import Kind, NewTask

# The states a task ends in without completing: its dependents can never run.
ENDED_UNCOMPLETED = frozenset({"failed", "cancelled", "timed_out", "skipped", "shed"})

# NOTIFY payloads must stay under 8000 bytes.
_MAX_WAKE_PAYLOAD = 7000


@dataclass(frozen=True, slots=True)
class Submitted:
    id: int
    created: bool


@dataclass(frozen=True, slots=True)
class Overload:
    """A queue's max_depth, what happens beyond it, and the types held there now (not counted)."""

    max_depth: int
    policy: str
    held: frozenset[str] = frozenset()

    def counts(self, task: NewTask) -> bool:
        """Fixed starts (promised at admission) and held work (waiting for a cheap window, not
        for capacity) neither count against max_depth nor get shed."""
        held = task.activity_type in self.held and task.kind is Kind.ACTIVITY
        return task.fixed is None and not held

    def rejection(self, queue: str, depth: int, adding: int) -> str | None:
        """Why the submission is refused (overflow = reject and no room), or None."""
        if self.policy != "reject" or depth + adding <= self.max_depth:
            return None
        return (
            f"queue {queue} is full: {depth} claimable tasks pending, max_depth "
            f"{self.max_depth} (overflow = reject); retry later"
        )

    def excess(self, depth: int, adding: int) -> int:
        """How many claimable tasks a shedding policy ends after the submission (0 for reject)."""
        return 0 if self.policy == "reject" else max(0, depth + adding - self.max_depth)

    def shed_reason(self, queue: str) -> str:
        return f"queue {queue} over max_depth {self.max_depth} ({self.policy})"


def counted(limit: Overload, queue: str, tasks: Iterable[NewTask]) -> int:
    """How many of the tasks count against the queue's max_depth."""
    return sum(1 for t in tasks if t.queue == queue and limit.counts(t))


def first_new(tasks: Sequence[NewTask], existing: Mapping[str, int]) -> list[int]:
    """Indexes of the tasks this submission will create: no key, or the first of a new key."""
    seen: set[str] = set()
    fresh = []
    for index, task in enumerate(tasks):
        key = task.idempotency_key
        if key is None:
            fresh.append(index)
        elif key not in existing and key not in seen:
            seen.add(key)
            fresh.append(index)
    return fresh


def submitted(
    tasks: Sequence[NewTask], inserted: Sequence[tuple[int, str | None]], existing: Mapping[str, int]
) -> list[Submitted]:
    """Each task's id and whether this submission created it, from the (id, key) pairs just
    inserted and the ids of keys stored before; a repeated key maps to its first task."""
    # Identity values grow in insertion order, which is the batch's order.
    new_ids = iter(sorted(i for i, _ in inserted))
    new_keys = {k for _, k in inserted if k}
    seen: dict[str, int] = {}
    out: list[Submitted] = []
    for task in tasks:
        key = task.idempotency_key
        if key is None:
            out.append(Submitted(next(new_ids), True))
        elif key in seen:
            out.append(Submitted(seen[key], False))
        elif key in new_keys:
            seen[key] = next(new_ids)
            out.append(Submitted(seen[key], True))
        else:
            seen[key] = existing[key]
            out.append(Submitted(seen[key], False))
    return out


def wanted_dependencies(tasks: Iterable[NewTask]) -> list[int]:
    return sorted({d for t in tasks for d in t.depends_on})


def unknown_dependencies(wanted: Iterable[int], states: Mapping[int, str]) -> list[int]:
    return [d for d in wanted if d not in states]


def ended_dependency(wanted: Iterable[int], states: Mapping[int, str]) -> tuple[int, str] | None:
    """The first dependency that already ended without completing (the task could never run)."""
    for d in wanted:
        if states[d] in ENDED_UNCOMPLETED:
            return d, states[d]
    return None


def pending_dependencies(tasks: Iterable[NewTask], states: Mapping[int, str]) -> list[int]:
    """How many unfinished dependencies each task waits for."""
    return [sum(1 for d in t.depends_on if states[d] != "completed") for t in tasks]


class OfQueueAndType(Protocol):
    @property
    def queue(self) -> str: ...

    @property
    def activity_type(self) -> str: ...


def wake_payload(tasks: Iterable[OfQueueAndType], origin: str | None = None) -> str:
    """The wake-up for new (or newly pending) tasks, as JSON: the (queue, type) pairs they are of
    (null, wake every group, when too many to name), and `origin`, the replica that stored them
    when it wakes its own dispatch itself (its listener skips the NOTIFY then: one claim per
    submit, not two)."""
    pairs = sorted({(t.queue, t.activity_type) for t in tasks})
    text = json.dumps({"origin": origin, "pairs": pairs})
    return text if len(text.encode()) < _MAX_WAKE_PAYLOAD else json.dumps({"origin": origin, "pairs": None})


def parse_wake(payload: str) -> tuple[str | None, list[tuple[str, str]] | None]:
    """A wake-up's origin (None: no replica woke itself for it) and its (queue, type) pairs
    (None: wake every group). Takes the earlier forms too (a JSON list of pairs, or "*"); anything
    else wakes every group."""
    try:
        message = json.loads(payload)
    except ValueError:
        return None, None
    origin, pairs = None, message
    if isinstance(message, dict):
        origin = message.get("origin")
        origin = origin if isinstance(origin, str) else None
        pairs = message.get("pairs")
    try:
        return origin, [(str(q), str(t)) for q, t in pairs]
    except (ValueError, TypeError):
        return origin, None
