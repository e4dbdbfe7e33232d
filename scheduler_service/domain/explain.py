"""Why is it pending? A pure answer from what the scheduler knows, for `lowtide task explain`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler_service.domain.claim_plan import Source, skip_sources
from scheduler_service.domain.holds import HoldState


@dataclass(frozen=True, slots=True)
class TaskFacts:
    state: str
    queue: str
    kind: str
    activity_type: str
    attempt: int
    run_at: datetime
    created_at: datetime
    worker_id: str | None = None
    started_at: datetime | None = None
    hold_deadline: datetime | None = None
    released_by: str | None = None
    dependencies_pending: int = 0
    planned_release_at: datetime | None = None
    planned_intensity: float | None = None
    plan_reason: str | None = None
    # The pool its plan placed it in (a task naming several pools), and its latest start.
    planned_pool: str | None = None
    latest_start: datetime | None = None


@dataclass(frozen=True, slots=True)
class Surroundings:
    now: datetime
    queue_paused_since: datetime | None = None
    held: bool = False
    hold: HoldState | None = None
    limit: int | None = None
    # The type's adaptive limit now, and why it is where it is (the last window's verdict).
    adaptive_limit: int | None = None
    adaptive_reason: str = ""
    running_of_type: int = 0
    workers_for_type: int = 0


def _at(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S")


def explain(task: TaskFacts, env: Surroundings) -> tuple[str, list[str]]:
    """A sentence for people and the reasons as codes, most decisive first."""
    placed = f"; placed in pool {task.planned_pool}: {task.plan_reason}" if task.planned_pool else ""
    if task.state == "running":
        since = f" since {_at(task.started_at)}" if task.started_at else ""
        return f"running: attempt {task.attempt} on worker {task.worker_id}{since}{placed}", ["running"]
    if task.state != "pending":
        note = " (released by max_defer while held)" if task.released_by == "max_defer" else ""
        return f"{task.state}: the task has ended{note}{placed}", [task.state]
    parts: list[str] = []
    codes: list[str] = []
    if env.queue_paused_since is not None:
        parts.append(f"queue {task.queue} has been paused since {_at(env.queue_paused_since)}")
        codes.append("queue_paused")
    if task.dependencies_pending > 0:
        count = task.dependencies_pending
        parts.append(f"waiting for {count} dependenc{'y' if count == 1 else 'ies'} to complete")
        codes.append("dependencies")
    elif task.planned_pool and task.planned_release_at is not None and task.attempt == 0:
        parts.append(_placed(task, env.now))
        codes.append("planned_release" if task.planned_release_at > env.now else "placed")
    elif task.planned_release_at is not None and task.attempt == 0 and task.run_at > env.now:
        expected = f", forecast mean {task.planned_intensity:g}" if task.planned_intensity is not None else ""
        parts.append(f"planned release at {_at(task.planned_release_at)}{expected}: {task.plan_reason}")
        codes.append("planned_release")
    elif task.run_at > env.now:
        wait = (task.run_at - env.now) / timedelta(seconds=1)
        parts.append(f"waiting out its retry backoff until {_at(task.run_at)} ({wait:.1f}s left)")
        codes.append("backoff")
    held = env.held and task.kind == "activity" and env.hold is not None
    sources = skip_sources(
        task.activity_type,
        static={task.activity_type: env.limit} if env.limit is not None else {},
        adaptive={task.activity_type: env.adaptive_limit} if env.adaptive_limit is not None else {},
        running=env.running_of_type,
        held=held,
    )
    for source in sources:
        parts.append(_skipped(source, task, env))
        codes.append(source.value)
    if env.workers_for_type == 0:
        parts.append(f"no connected worker runs activity type {task.activity_type} on queue {task.queue}")
        codes.append("no_worker")
    if not parts:
        return "ready: waiting for a free worker slot", ["ready"]
    return "; ".join(parts), codes


def _placed(task: TaskFacts, now: datetime) -> str:
    """A task the plan placed in one of the pools it names: where and when, or that it waits there."""
    assert task.planned_release_at is not None
    if task.planned_release_at > now:
        expected = f", forecast mean {task.planned_intensity:g}" if task.planned_intensity is not None else ""
        when = _at(task.planned_release_at)
        return f"planned release in pool {task.planned_pool} at {when}{expected}: {task.plan_reason}"
    until = f" until its latest start at {_at(task.latest_start)}" if task.latest_start else ""
    return (
        f"released in pool {task.planned_pool}: only its workers take it{until}, then any pool it names "
        f"({task.plan_reason})"
    )


def _skipped(source: Source, task: TaskFacts, env: Surroundings) -> str:
    """The sentence for one source of the skip list that keeps the task's type out of claims."""
    name = task.activity_type
    if source is Source.COST_HOLD:
        assert env.hold is not None
        since = f" (the hold has been active since {_at(env.hold.since)})" if env.hold.since else ""
        text = f"held: activity type {name} is cost-deferrable and {env.hold.reason}{since}"
        if task.hold_deadline is not None:
            text += f"; it runs anyway at {_at(task.hold_deadline)} (max_defer)"
        return text
    if source is Source.STATIC_LIMIT:
        return f"activity type {name} is at its concurrency limit ({env.running_of_type}/{env.limit})"
    why = f"; {env.adaptive_reason}" if env.adaptive_reason else ""
    return (
        f"activity type {name} is at its adaptive concurrency limit ({env.running_of_type}/{env.adaptive_limit}{why})"
    )
