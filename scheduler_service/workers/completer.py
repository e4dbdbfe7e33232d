"""The batch completer: reports from every worker are applied together, one statement per batch.

While a batch is being written the next one gathers, so under load batches grow by themselves
and the cost per report falls. Under a flow of single submits a report waits a little (the
submits' pace says how long, domain/finish_hold.py) for the next group of submits, whose insert
writes it in its own commit (tasks/submission.py lends it; docs/architecture/tasks.md). A batch
that cannot be written (database away) is kept and retried: a report the worker was told nothing
about is never dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Collection, Container, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from opentelemetry.context import Context

from lowtide.errors import DatabaseUnavailable
from lowtide_proto.backoff import Backoff
from scheduler_service.domain.finish_hold import MAX_HOLD, SubmitPace
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
# The most reports a group of single submits is lent: a few submits' insert carries no more
# finishes than a claim's worth (a drain with a trickle of submits would lend it thousands).
MAX_LENT = 256

# A report taken: the order it came in, when (the loop's clock), what it says, from whom.
_Entry = tuple[int, float, Outcome, WorkerSession | None]
# The key of the batch the completer is writing itself, among those out (lent ones have others),
# and the key of nothing lent.
_OWN = 0
_NOTHING = -1


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
        # Reports taken and not written yet; those a group's insert was lent and gave back (to be
        # counted and answered, and written if the insert did not apply them), written first; and
        # those out being written, by the completer (_OWN) or lent to a group's insert (by key).
        self._pending: list[_Entry] = []
        self._returned: list[_Entry] = []
        self._out: dict[int, list[_Entry]] = {}
        # What a group's insert, or a failed write, applied already: the next write skips them.
        self._applied: dict[tuple[int, int], FinishedRow] = {}
        self._order = itertools.count()
        self._keys = itertools.count(_OWN + 1)
        # The result spans to end once written: the trace context and when the report came, per attempt.
        self._traces = traces
        self._traced: dict[tuple[int, int], tuple[Context, int]] = {}
        self._ready = asyncio.Event()
        # Set to end a report's wait for a group: a group took it, gave some back, or a flush waits.
        self._release = asyncio.Event()
        self._pace = SubmitPace()
        # Who waits for the reports taken by then to be written (flushed): under a steady flow of
        # reports the completer is never idle, so "all written" must mean those taken by then.
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
        self._pending.append((next(self._order), asyncio.get_running_loop().time(), outcome, session))
        if traced is not None and traced[0] is not None and self._traces is not None:
            self._traced[(outcome.task_id, outcome.attempt)] = (traced[0], traced[1])
        self._ready.set()

    def submitted(self) -> None:
        """A single submit came (tasks/submission.py): the pace a report's wait follows."""
        self._pace.submitted(asyncio.get_running_loop().time())

    def lend(self) -> tuple[int, list[tuple[Outcome, str | None]]]:
        """The reports waiting, for a group's insert to apply in its commit, under a key to give
        them back with; (_NOTHING, []) when none wait."""
        if not self._pending:
            return _NOTHING, []
        key = next(self._keys)
        lent = self._out[key] = self._pending[:MAX_LENT]
        del self._pending[:MAX_LENT]
        self._release.set()
        return key, [(outcome, session.worker_id if session else None) for _, _, outcome, session in lent]

    def give_back(self, key: int, applied: Mapping[tuple[int, int], FinishedRow] | None) -> None:
        """The reports lent under `key`, with those the insert applied (None: it failed): counted
        and answered at once, and the others written the usual way."""
        lent = self._out.pop(key, None) if key != _OWN else None
        if lent is None:
            return
        if applied:
            self._applied.update(
                (ref, row) for _, _, o, _ in lent if (row := applied.get(ref := (o.task_id, o.attempt)))
            )
        self._returned.extend(lent)
        self._release.set()
        self._ready.set()

    def _entries(self) -> itertools.chain[_Entry]:
        return itertools.chain(self._pending, self._returned, *self._out.values())

    def unwritten(self) -> set[tuple[int, int]]:
        """The attempts (task id, attempt) whose reports are taken and not yet written."""
        return {(outcome.task_id, outcome.attempt) for _, _, outcome, _ in self._entries()}

    async def flushed(self) -> None:
        """Waits until every report added so far has been written (not those added meanwhile)."""
        target = next(self._order)
        if self._first_unwritten() >= target:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (target, waiter)
        self._flush_waiters.append(entry)
        self._release.set()
        try:
            await waiter
        finally:
            if entry in self._flush_waiters:
                self._flush_waiters.remove(entry)

    def _first_unwritten(self) -> float:
        return min((order for order, _, _, _ in self._entries()), default=float("inf"))

    def _written(self) -> None:
        if not self._flush_waiters:
            return
        first = self._first_unwritten()
        for target, waiter in self._flush_waiters:
            if target <= first and not waiter.done():
                waiter.set_result(None)

    async def run(self) -> None:
        backoff = Backoff(initial=0.05, maximum=2.0)
        while True:
            if not self._pending and not self._returned:
                await self._ready.wait()
                self._ready.clear()
                continue
            if not self._returned:
                await self._hold()
            source = self._returned or self._pending
            if not source:
                continue  # a group took them all
            batch = self._out[_OWN] = source[:MAX_BATCH]
            del source[:MAX_BATCH]
            written = {
                ref: row for _, _, o, _ in batch if (row := self._applied.pop(ref := (o.task_id, o.attempt), None))
            }
            try:
                applied = await self._write(batch, written)
            except DatabaseUnavailable as error:
                log.warning("completer.retrying", extra={"error": str(error), "batch": len(batch)})
                # What it wrote before it failed is skipped by the next try.
                self._applied.update(written)
                source[:0] = self._out.pop(_OWN)
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff.reset()
            del self._out[_OWN]
            self._written()
            try:
                self._after(batch, applied)
            except Exception:
                # Written already: a bug in what follows (a waiter, a metric, a span) must not end
                # the loop, which groups of submits go on lending reports to.
                log.exception("completer.after_failed", extra={"batch": len(batch)})

    async def _hold(self) -> None:
        """Lets the reports waiting wait for a group of submits to take them, as long as the
        submits' pace says from now, the oldest no longer than MAX_HOLD from when it came, and
        none while a flush waits."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        hold = self._pace.hold(now)
        wait = min(hold, self._pending[0][1] + MAX_HOLD - now) if hold > 0 else 0.0
        if wait <= 0 or self._flush_waiters:
            return
        self._release.clear()
        timer = loop.call_later(wait, self._release.set)
        try:
            await self._release.wait()
        finally:
            timer.cancel()

    def _after(self, batch: list[_Entry], applied: dict[tuple[int, int], FinishedRow]) -> None:
        """What follows a batch written: counts, freed slots and retries, spans, stale reports
        answered, waiters told."""
        stale: dict[int, tuple[WorkerSession, list[tuple[int, int]]]] = {}
        for _, _, outcome, session in batch:
            ref = (outcome.task_id, outcome.attempt)
            if ref not in applied and session is not None:
                stale.setdefault(id(session), (session, []))[1].append(ref)
        self._count(batch, applied)
        self._on_freed(applied.values())
        for due, pairs in retries_due((o for _, _, o, _ in batch), applied).items():
            self._on_retry(due, pairs)
        if self._traced:
            self._trace(batch, applied)
        for session, refs in stale.values():
            session.reject(refs, "the attempt is no longer this worker's (lease lost, cancelled or timed out)")
        # The tasks this batch finished (not those that go back to wait for a retry).
        self._on_applied(
            [o.task_id for _, _, o, _ in batch if o.state is not State.PENDING and (o.task_id, o.attempt) in applied]
        )

    async def _write(
        self, batch: list[_Entry], written: dict[tuple[int, int], FinishedRow]
    ) -> dict[tuple[int, int], FinishedRow]:
        """The batch's reports applied, by (id, attempt); `written` holds what a failed try of the
        same batch wrote before it failed, and gains what this one writes."""
        try:
            return await self._store.finish([(o, s.worker_id if s else None) for _, _, o, s in batch], written)
        except DatabaseUnavailable:
            raise
        except Exception:
            # One report the database refuses must not stall every other: write them one by one,
            # and leave out (refuse) only the ones that fail alone.
            log.exception("completer.batch_refused", extra={"batch": len(batch)})
            applied = written
            for _, _, outcome, session in batch:
                try:
                    await self._store.finish([(outcome, session.worker_id if session else None)], applied)
                except DatabaseUnavailable:
                    raise
                except Exception:
                    log.exception("completer.report_refused", extra={"task_id": outcome.task_id})
            return applied

    def _trace(self, batch: list[_Entry], applied: Container[tuple[int, int]]) -> None:
        """The result spans of the batch's traced reports that were written (the rest were refused)."""
        assert self._traces is not None
        for _, _, outcome, _ in batch:
            ref = (outcome.task_id, outcome.attempt)
            traced = self._traced.pop(ref, None)
            if traced is not None and ref in applied:
                self._traces.recorded(traced[0], outcome, traced[1])

    def _count(self, batch: list[_Entry], applied: dict[tuple[int, int], FinishedRow]) -> None:
        self.metrics.tasks.ended(applied.values())
        self.adaptive.record(
            (o, applied[(o.task_id, o.attempt)]) for _, _, o, _ in batch if (o.task_id, o.attempt) in applied
        )
        rejected = sum(1 for _, _, outcome, _ in batch if (outcome.task_id, outcome.attempt) not in applied)
        if rejected:
            self.metrics.rejected.add(rejected, {"reason": "no_longer_held"})
