"""How single submits are cut into groups (tasks/submit_groups.py), with a writer that records
what it is given: at most MAX_GROUP tasks, and no more payload than MAX_GROUP_BYTES but for a
group's first task, every caller answered with its own task."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest

from scheduler_service.domain.model import Kind, NewTask, RetryPolicy
from scheduler_service.domain.submission import Submitted
from scheduler_service.rows.tasks import TaskRow
from scheduler_service.tasks import submit_groups
from scheduler_service.tasks.submission import groupable
from scheduler_service.tasks.submit_groups import MAX_GROUP, MAX_GROUP_BYTES, SubmitGroups

RETRY = RetryPolicy(3, timedelta(seconds=1), 2.0, timedelta(minutes=1))


def _task(payload: bytes) -> NewTask:
    return NewTask("default", Kind.ACTIVITY, "work", payload, 0, None, RETRY, None, None, None)


async def _grouped(payloads: list[bytes]) -> tuple[list[list[int]], list[int]]:
    """The groups written (each a list of its tasks' payload sizes), and the id each caller got."""
    groups: list[list[int]] = []
    ids = iter(range(1, 1_000_000))

    async def write(tasks: Sequence[NewTask], submitted_by: str | None) -> tuple[list[Submitted], dict[int, TaskRow]]:
        groups.append([len(t.payload) for t in tasks])
        await asyncio.sleep(0)  # the next group gathers meanwhile
        out = [Submitted(next(ids), True) for _ in tasks]
        return out, {s.id: object() for s in out}  # type: ignore[misc]

    writer = SubmitGroups(write)
    answers = await asyncio.gather(*(writer.submit(_task(p), None) for p in payloads))
    return groups, [submitted.id for submitted, _ in answers]


async def test_a_group_takes_no_more_than_max_group_tasks() -> None:
    groups, ids = await _grouped([b"x"] * (2 * MAX_GROUP + 3))
    assert max(len(g) for g in groups) == MAX_GROUP
    assert sum(len(g) for g in groups) == 2 * MAX_GROUP + 3
    assert sorted(ids) == list(range(1, 2 * MAX_GROUP + 4))


async def test_a_group_takes_no_more_payload_than_the_bound_but_its_first_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(submit_groups, "MAX_GROUP_BYTES", 1000)
    sizes = [400, 400, 400, 1500, 10, 990, 20, 5]
    groups, ids = await _grouped([b"p" * n for n in sizes])
    # All wait at once, cut in arrival order; a task over the bound goes alone.
    assert groups == [[400, 400], [400], [1500], [10, 990], [20, 5]]
    assert len(set(ids)) == len(sizes)


def test_a_payload_over_the_group_bound_is_stored_alone() -> None:
    assert groupable(_task(b"p" * MAX_GROUP_BYTES))
    assert not groupable(_task(b"p" * (MAX_GROUP_BYTES + 1)))
