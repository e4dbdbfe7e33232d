"""The batch completer: reports from every worker are applied together, one statement per batch.

While a batch is being written the next one gathers, so under load batches grow by themselves
and the cost per report falls. A batch that cannot be written (database away) is kept and
retried: a report the worker was told nothing about is never dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Container
from datetime import datetime
from typing import TYPE_CHECKING

from opentelemetry.context import Context

from lowtide.errors import DatabaseUnavailable
from lowtide_proto.backoff import Backoff
from scheduler_service.domain.model import Outcome, State
from scheduler_service.fleet.sessions import WorkerSession
from scheduler_service.observe.tracing import TaskTraces
from scheduler_service.rows.tasks import FinishedRow
from scheduler_service.store import Store, retries_due

if TYPE_CHECKING:
    from scheduler_service.dispatch.adaptive import AdaptiveLimits
    from scheduler_service.observe.metrics import SchedulerMetrics

log = logging.getLogger("lowtide.scheduler.completer")

MAX_BATCH = 2000


class Completer:
    def __init__(
        self,
        store: Store,
        *,
        metrics: SchedulerMetrics,
        on_applied: Callable[[list[int]], None],
        traces: TaskTraces | None,
        adaptive: AdaptiveLimits,
        on_freed: Callable[[Collection[FinishedRow]], None],
        on_retry: Callable[[datetime, set[tuple[str, str]]], None],
    ) -> None:
        self._store = store
        self._pending: list[tuple[Outcome, WorkerSession | None]] = []
        # The result spans to end once written: the trace context and when the report came, per attempt.
        self._traces = traces
        self._traced: dict[tuple[int, int], tuple[Context, int]] = {}
        self._ready = asyncio.Event()
        # Reports taken so far and, of those, how many are written (in the order they came), and
        # who waits for a count to be written (flushed): under a steady flow of reports the
        # completer is never idle, so "all written" must mean those taken by then.
        self._taken = 0
        self._written = 0
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._on_applied = on_applied
        self.metrics = metrics
        # Tallies what the attempts of adaptive types showed (in memory; written once a window).
        self.adaptive = adaptive
        # Told the attempts every batch ended: a type at its limit may be claimed again.
        self._on_freed = on_freed
        # Told when each retry the batch wrote is due, so it is claimed then, not at a later poll.
        self._on_retry = on_retry

    def add(
        self, outcome: Outcome, session: WorkerSession | None, traced: tuple[Context | None, int] | None = None
    ) -> None:
        """Takes a report to write; `traced` (tracing on): the attempt's trace context and when it came."""
        self._pending.append((outcome, session))
        self._taken += 1
        if traced is not None and traced[0] is not None and self._traces is not None:
            self._traced[(outcome.task_id, outcome.attempt)] = (traced[0], traced[1])
        self._ready.set()

    def unwritten(self) -> set[tuple[int, int]]:
        """The attempts (task id, attempt) whose reports are taken and not yet written."""
        return {(outcome.task_id, outcome.attempt) for outcome, _ in self._pending}

    async def flushed(self) -> None:
        """Waits until every report added so far has been written (not those added meanwhile)."""
        if self._written >= self._taken:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._taken, waiter)
        self._flush_waiters.append(entry)
        try:
            await waiter
        finally:
            if entry in self._flush_waiters:
                self._flush_waiters.remove(entry)

    def _written_up_to(self, count: int) -> None:
        self._written = count
        for target, waiter in self._flush_waiters:
            if target <= count and not waiter.done():
                waiter.set_result(None)

    async def run(self) -> None:
        backoff = Backoff(initial=0.05, maximum=2.0)
        while True:
            await self._ready.wait()
            self._ready.clear()
            # What a failed write had already written (store.finish): its next try skips it.
            written: dict[tuple[int, int], FinishedRow] = {}
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                try:
                    applied = await self._write(batch, written)
                except DatabaseUnavailable as error:
                    log.warning("completer.retrying", extra={"error": str(error), "batch": len(batch)})
                    await asyncio.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                written = {}
                del self._pending[: len(batch)]
                self._written_up_to(self._written + len(batch))
                stale: dict[int, tuple[WorkerSession, list[tuple[int, int]]]] = {}
                for outcome, session in batch:
                    ref = (outcome.task_id, outcome.attempt)
                    if ref not in applied and session is not None:
                        stale.setdefault(id(session), (session, []))[1].append(ref)
                self._count(batch, applied)
                self._on_freed(applied.values())
                for due, pairs in retries_due((o for o, _ in batch), applied).items():
                    self._on_retry(due, pairs)
                if self._traced:
                    self._trace(batch, applied)
                for session, refs in stale.values():
                    session.reject(refs, "the attempt is no longer this worker's (lease lost, cancelled or timed out)")
                # The tasks this batch finished (not those that go back to wait for a retry).
                self._on_applied(
                    [o.task_id for o, _ in batch if o.state is not State.PENDING and (o.task_id, o.attempt) in applied]
                )

    async def _write(
        self, batch: list[tuple[Outcome, WorkerSession | None]], written: dict[tuple[int, int], FinishedRow]
    ) -> dict[tuple[int, int], FinishedRow]:
        """The batch's reports applied, by (id, attempt); `written` holds what a failed try of the
        same batch wrote before it failed, and gains what this one writes."""
        try:
            return await self._store.finish([(o, s.worker_id if s else None) for o, s in batch], written)
        except DatabaseUnavailable:
            raise
        except Exception:
            # One report the database refuses must not stall every other: write them one by one,
            # and leave out (refuse) only the ones that fail alone.
            log.exception("completer.batch_refused", extra={"batch": len(batch)})
            applied = written
            for outcome, session in batch:
                try:
                    await self._store.finish([(outcome, session.worker_id if session else None)], applied)
                except DatabaseUnavailable:
                    raise
                except Exception:
                    log.exception("completer.report_refused", extra={"task_id": outcome.task_id})
            return applied

    def _trace(self, batch: list[tuple[Outcome, WorkerSession | None]], applied: Container[tuple[int, int]]) -> None:
        """The result spans of the batch's traced reports that were written (the rest were refused)."""
        assert self._traces is not None
        for outcome, _ in batch:
            ref = (outcome.task_id, outcome.attempt)
            traced = self._traced.pop(ref, None)
            if traced is not None and ref in applied:
                self._traces.recorded(traced[0], outcome, traced[1])

    def _count(
        self, batch: list[tuple[Outcome, WorkerSession | None]], applied: dict[tuple[int, int], FinishedRow]
    ) -> None:
        self.metrics.tasks.ended(applied.values())
        self.adaptive.record(
            (o, applied[(o.task_id, o.attempt)]) for o, _ in batch if (o.task_id, o.attempt) in applied
        )
        rejected = sum(1 for outcome, _ in batch if (outcome.task_id, outcome.attempt) not in applied)
        if rejected:
            self.metrics.rejected.add(rejected, {"reason": "no_longer_held"})
