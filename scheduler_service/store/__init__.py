"""The scheduler's storage adapter: domain values in, rows out, every query from sql/ (one file per module).

Every hot-path call works on a batch: one statement stores many submits, claims up to a worker's
free slots, or finishes many attempts. Each concern lives in its own module; Store joins them.
May import rows and domain only.
"""

from __future__ import annotations

from collections.abc import Callable

from lowtide.db import Database
from scheduler_service.rows.tasks import UnblockedRow
from scheduler_service.store.adaptive import AdaptiveStore
from scheduler_service.store.base import Q, attempt_of, retry_policy_of
from scheduler_service.store.claims import ClaimStore
from scheduler_service.store.fixed import FixedStore
from scheduler_service.store.queues import QueueStore
from scheduler_service.store.schedules import ScheduleStore
from scheduler_service.store.submissions import SubmissionStore, SubmissionWrites
from scheduler_service.store.tasks import TaskStore, retries_due
from scheduler_service.store.waits import WaitStore
from scheduler_service.store.workers import WorkerStore

__all__ = ["Q", "Store", "SubmissionWrites", "attempt_of", "retries_due", "retry_policy_of"]


class Store(
    TaskStore, ClaimStore, SubmissionStore, FixedStore, QueueStore, WorkerStore, WaitStore, AdaptiveStore, ScheduleStore
):
    def __init__(self, db: Database, *, on_unblocked: Callable[[list[UnblockedRow]], None]) -> None:
        self.db = db
        self.on_unblocked = on_unblocked
        self.registered_queues: set[str] = set()
