"""A batch of submits planned at the submit (ReleasePlanner.plan_submitted, on the event loop):
the tasks alike (the same signal or pools, latest start and duration) have one plan, made once,
the one a task alone would have; a task unlike them has its own. A batch of 1,000 alike held the
loop for up to 3.5 s, planning each anew."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler_service.domain.model import Kind, NewTask, RetryPolicy
from scheduler_service.domain.planning import Forecast
from scheduler_service.holds import release_planning
from scheduler_service.store import Store
from tests.planning.test_pool_drop import _holds, _planner, store  # noqa: F401  (the fixture)

_TASK = NewTask("default", Kind.ACTIVITY, "train", b"", 0, None, RetryPolicy(3, timedelta(1), 2.0, timedelta(60)),
                None, None, None, duration=timedelta(minutes=30))  # fmt: skip


def _fields(task: NewTask) -> tuple[Any, ...]:
    return task.planned_release_at, task.planned_intensity, task.plan_reason, task.planned_pool


async def test_tasks_alike_in_a_batch_are_planned_once_as_one_alone(
    store: Store,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime.now(UTC)
    holds = _holds(now)
    # The signal a type naming no pool follows: a clean hour two hours ahead.
    hours = [now + timedelta(minutes=30 * i) for i in range(8)]
    holds.by_signal["grid"].forecast = Forecast.of((at, 100.0 if i in (4, 5) else 300.0) for i, at in enumerate(hours))
    planner = _planner(store, now, holds)
    latest = now + timedelta(hours=3)
    placed = replace(_TASK, latest_start=latest, pools=("eu-west", "eu-central"))
    followed = replace(_TASK, latest_start=latest)
    sooner = replace(_TASK, latest_start=now + timedelta(hours=1), pools=("eu-west", "eu-central"))
    alone = {name: planner.plan_submitted([task])[0] for name, task in
             (("placed", placed), ("followed", followed), ("sooner", sooner))}  # fmt: skip

    calls: list[str] = []
    for name in ("plan_tasks", "regions"):
        real = getattr(release_planning, name)
        if name == "regions":
            placed_fn = real.placed

            def counting_placed(*args: Any, _real: Any = placed_fn, **kwargs: Any) -> Any:
                calls.append("placed")
                return _real(*args, **kwargs)

            monkeypatch.setattr(real, "placed", counting_placed)
        else:

            def counting_plan(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                calls.append("plan")
                return _real(*args, **kwargs)

            monkeypatch.setattr(release_planning, name, counting_plan)

    batch = [placed] * 500 + [followed] * 500 + [sooner]
    out = planner.plan_submitted(batch)

    assert sorted(calls) == ["placed", "placed", "plan"]
    assert {_fields(t) for t in out[:500]} == {_fields(alone["placed"])}
    assert {_fields(t) for t in out[500:1000]} == {_fields(alone["followed"])}
    # Released at once, at the batch's moment, where alone it was a moment earlier.
    assert _fields(out[1000])[1:] == _fields(alone["sooner"])[1:]
    # The plans say something: the pool tasks go to the clean hour in Germany, the sooner one
    # (latest start before it) does not wait for it.
    assert out[0].planned_pool == "eu-central" and out[0].planned_release_at is not None
    assert out[1000].planned_release_at is not None and out[1000].planned_release_at < now + timedelta(minutes=1)
    assert out[500].planned_release_at is not None and out[500].planned_release_at > now + timedelta(hours=1)
