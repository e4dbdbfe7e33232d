"""The rows of the fleet: queues and their backlog, workers and pools, fixed starts' reservations
and misses, release planning, and the database's clock (sql/workers.sql, queues.sql, fixed.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler_service.domain.fixed import FixedStart, MissFacts, MissPolicy


@dataclass(frozen=True, slots=True)
class StoredSignal:
    """A signal's state as the signal service stored it (`stored_signal`)."""

    name: str
    value: float | None
    threshold: float
    stale: bool
    unit: str
    version: int


@dataclass(frozen=True, slots=True)
class PausedQueue:
    """A queue paused now, and since when (`pause_queue`, `paused_queues`)."""

    name: str
    paused_at: datetime


@dataclass(frozen=True, slots=True)
class ResumedQueue:
    """A queue just resumed, and how long its pause lasted, None when it has no pause time
    (`resume_queue`)."""

    name: str
    paused_for: timedelta | None


@dataclass(frozen=True, slots=True)
class QueueName:
    """A queue the database knows (`known_queues`)."""

    name: str


@dataclass(frozen=True, slots=True)
class PendingGroup:
    """Claimable pending tasks of one (queue, type, kind): how many, and the oldest's age in
    seconds (`pending_by_queue_and_type`)."""

    queue: str
    activity_type: str
    kind: str
    depth: int
    oldest_age: float


@dataclass(frozen=True, slots=True)
class QueueRunning:
    """Running attempts of one queue (`running_by_queue`)."""

    queue: str
    running: int


@dataclass(frozen=True, slots=True)
class TypeRunning:
    """Running attempts of one activity type (`count_running_by_type`)."""

    activity_type: str
    running: int


@dataclass(frozen=True, slots=True)
class WorkerCount:
    """Connected workers that run a type on a queue (`workers_for_type`)."""

    workers: int


@dataclass(frozen=True, slots=True)
class PoolWorkers:
    """A pool's connected workers, their slots, and how many of those run an attempt (`pools`)."""

    pool: str
    workers: int
    slots: int
    busy: int


@dataclass(frozen=True, slots=True)
class CarbonByType:
    """For one type: tasks dispatched with a known signal, and the sums of the signal at their
    submission and at their dispatch (`carbon_totals`)."""

    activity_type: str
    tasks: int
    sum_at_submit: float
    sum_at_dispatch: float


@dataclass(frozen=True, slots=True)
class DatabaseClock:
    """The database's clock (`now`), which every deadline is measured against."""

    now: datetime


@dataclass(frozen=True, slots=True)
class PoolSlots:
    """Slots of a pool's connected workers that run some given types (`pool_slots`)."""

    pool: str
    slots: int


@dataclass(frozen=True, slots=True)
class PoolType:
    """A type some connected worker of a pool runs on a queue (`pool_types`)."""

    pool: str
    queue: str
    activity_type: str


@dataclass(frozen=True, slots=True)
class PoolPlanned:
    """Held tasks placed in a pool by their plan, not released yet, and the soonest of them
    (`planned_by_pool`)."""

    pool: str
    planned: int
    next_task_id: int
    next_at: datetime
    next_intensity: float | None


@dataclass(frozen=True, slots=True)
class PlannableTask:
    """A pending first attempt with a latest start, whose release the planner chooses
    (`plannable_tasks`)."""

    id: int
    queue: str
    activity_type: str
    kind: str
    created_at: datetime
    latest_start: datetime
    estimated_duration_ms: int | None
    # The release its last plan chose (None: not planned on a forecast yet).
    planned_release_at: datetime | None
    # The pools it may run in (None: any), and the one its last plan placed it in.
    pools: list[str] | None
    planned_pool: str | None


@dataclass(frozen=True, slots=True)
class RecentDeferrable:
    """Submissions with a latest start in a 5-minute bucket of the last day (`recent_deferrable`):
    the work the planner expects again."""

    at: datetime
    queue: str
    activity_type: str
    kind: str
    # Whether they named the pools they may run in (placed among them, see holds/regions.py).
    named_pools: bool
    slack_ms: int
    estimated_duration_ms: int | None
    count: int


@dataclass(frozen=True, slots=True)
class ReleaseDue:
    """When a planned task is due (`upcoming_releases`)."""

    due: datetime


@dataclass(frozen=True, slots=True)
class UpcomingFixed:
    """The first attempt of a fixed start ahead, for slot holds (`upcoming_fixed`)."""

    id: int
    pool: str
    queue: str
    activity_type: str
    start_at: datetime
    start_tolerance_ms: int
    on_miss: str
    estimated_duration_ms: int

    @property
    def fixed(self) -> FixedStart:
        return FixedStart(
            self.start_at,
            timedelta(milliseconds=self.start_tolerance_ms),
            MissPolicy(self.on_miss),
            timedelta(milliseconds=self.estimated_duration_ms),
        )


@dataclass(frozen=True, slots=True)
class MissedFixed:
    """A first attempt not started by start + tolerance, with what explains it (`missed_fixed`)."""

    id: int
    pool: str
    queue: str
    activity_type: str
    on_miss: str
    start_at: datetime
    dependencies_pending: bool
    needs_resources: bool
    queue_paused: bool
    workers_in_pool: int
    workers_for_type: int
    slots: int
    busy: int
    busy_fixed: int
    scheduler_ran: bool
    down_from: datetime | None
    down_to: datetime | None

    def facts(self, held_for_others: int) -> MissFacts:
        """What the miss policy's reason is chosen from; `held_for_others` is this replica's
        slots held in the pool for other fixed starts."""
        return MissFacts(
            pool=self.pool,
            queue=self.queue,
            activity_type=self.activity_type,
            start_at=self.start_at,
            scheduler_ran=self.scheduler_ran,
            down_from=self.down_from,
            down_to=self.down_to,
            dependencies_pending=self.dependencies_pending,
            queue_paused=self.queue_paused,
            needs_resources=self.needs_resources,
            workers_in_pool=self.workers_in_pool,
            workers_for_type=self.workers_for_type,
            slots=self.slots,
            busy=self.busy,
            busy_fixed=self.busy_fixed,
            held_for_others=held_for_others,
        )


@dataclass(frozen=True, slots=True)
class MissApplied:
    """A miss policy applied: the task's state after it (skipped, or still pending to run late),
    the reason and its kind (`mark_missed`)."""

    id: int
    pool: str
    state: str
    reason: str
    kind: str
    has_dependents: bool


@dataclass(frozen=True, slots=True)
class PoolFixedStats:
    """Per pool: the start times of admitted fixed starts not started yet, and the hit rate of
    first attempts, None before any (`pool_fixed_stats`)."""

    pool: str
    ahead: list[datetime] | None
    hit_rate: float | None


@dataclass(frozen=True, slots=True)
class ReservationWindow:
    """The window of an admitted fixed start not finished yet (`live_reservations`)."""

    window_start: datetime
    window_end: datetime
    pool: str
