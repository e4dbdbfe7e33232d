"""WaitTask's waiters: one future per waiting call, by task id.

A waiter is resolved by what finishes its task: this replica's completer with the ids it applied,
a NOTIFY (lowtide_done) from another replica's completer with its ids (sent only while another
replica runs), a cancel here. Whatever else
finishes a task (a timeout the leader applies, a cancel on another replica, shedding) is found by
one check per replica every FALLBACK seconds for all waited ids at once, never a query per waiter,
and nothing at all while no one waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator

from lowtide.errors import DatabaseUnavailable
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.waiters")

FALLBACK = 1.0  # seconds between the replica's checks of every waited task


class Waiters:
    def __init__(self, store: Store, *, fallback: float = FALLBACK) -> None:
        self._store = store
        self._fallback = fallback
        self._waiting: dict[int, set[asyncio.Future[None]]] = {}
        self._someone = asyncio.Event()
        # Finished ids to announce to the other replicas, gathered while a NOTIFY is being sent.
        self._announce: list[int] = []
        self._announcing = asyncio.Event()
        # Whether another replica runs (maintenance learns it every tick): only then are finished
        # tasks announced, so a lone replica sends no NOTIFY per batch.
        self.others = False

    def others_running(self, others: bool) -> None:
        self.others = others

    def __len__(self) -> int:
        return sum(len(futures) for futures in self._waiting.values())

    @contextlib.contextmanager
    def waiter(self, task_id: int) -> Iterator[asyncio.Future[None]]:
        """A future resolved once the task is known to have finished (registered before the
        caller reads the task, so a finish between the read and the wait is not missed)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(task_id, set()).add(future)
        self._someone.set()
        try:
            yield future
        finally:
            futures = self._waiting.get(task_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._waiting[task_id]

    def finished(self, ids: Iterable[int]) -> None:
        """These tasks finished: their waiters return."""
        if not self._waiting:
            return
        for task_id in ids:
            for future in self._waiting.get(task_id, ()):
                if not future.done():
                    future.set_result(None)

    def applied(self, ids: list[int]) -> None:
        """This replica's completer finished these tasks: resolve the waiters here, and tell the
        other replicas (one NOTIFY for every batch finished while the previous one was sent)."""
        if not ids:
            return
        self.finished(ids)
        if self.others:
            self._announce.extend(ids)
            self._announcing.set()

    async def announce(self) -> None:
        """Sends the finished ids to every replica, until cancelled."""
        while True:
            await self._announcing.wait()
            self._announcing.clear()
            ids, self._announce = self._announce, []
            try:
                await self._store.notify_finished(ids)
            except DatabaseUnavailable as error:
                # The other replicas' checks find these tasks finished within FALLBACK.
                log.warning("waiters.announce_failed", extra={"error": str(error), "tasks": len(ids)})

    async def check(self) -> None:
        """Every FALLBACK seconds while anyone waits: one query for every waited task."""
        while True:
            await self._someone.wait()
            await asyncio.sleep(self._fallback)
            if not self._waiting:
                self._someone.clear()
                continue
            try:
                done = await self._store.finished_among(list(self._waiting))
            except DatabaseUnavailable as error:
                log.warning("waiters.check_failed", extra={"error": str(error)})
                continue
            self.finished(done)
