"""Worker leases, renewed per replica: one statement per tick for every session heard from.

A heartbeat only marks its session heard; every tick (half the heartbeat interval, so a lease
never waits more than that for its renewal) the replica renews the leases of all the sessions it
heard from since the last tick in one statement. An idle fleet of N workers so costs one commit
per tick, not N per heartbeat interval. A session whose renewal finds its lease gone (it ran out
while the worker was silent, or the worker connected elsewhere) ends as before: UNAVAILABLE, and
its attempts are lost.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from lowtide.errors import DatabaseUnavailable, Unavailable
from lowtide_proto.durations import format_duration
from scheduler_service.sessions import Registry, WorkerSession
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.workers")


class Leases:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        scheduler_id: str,
        lease_timeout: timedelta,
        heartbeat_interval: timedelta,
    ) -> None:
        self._store = store
        self._registry = registry
        self._scheduler_id = scheduler_id
        self._lease = lease_timeout
        self._tick = heartbeat_interval.total_seconds() / 2
        # Renewal statements run (one per tick with any session heard from).
        self.renewals = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            await self.renew()

    async def renew(self) -> None:
        """Renews the leases of every session heard from since the last renewal; ends those
        whose lease was gone."""
        heard = [s for s in self._registry if s.heard and not s.closed]
        if not heard:
            return
        for session in heard:
            session.heard = False
        try:
            self.renewals += 1
            renewed = await self._store.renew_workers(
                {s.worker_id: s.slots for s in heard}, self._lease, self._scheduler_id
            )
        except DatabaseUnavailable as error:
            # A busy pool or a database restart is not the workers' fault: their streams stay,
            # and the next tick renews the leases (or finds them gone).
            log.warning("worker.heartbeat_deferred", extra={"workers": len(heard), "error": str(error)})
            for session in heard:
                session.heard = True
            return
        for session in heard:
            if session.worker_id not in renewed and not session.closed:
                self._lost(session)

    def _lost(self, session: WorkerSession) -> None:
        lease = format_duration(self._lease)
        session.lost_reason = f"the worker's lease ran out (nothing heard from it for {lease})"
        session.end(
            Unavailable(
                f"worker {session.worker_id}: its lease ran out before this heartbeat (nothing heard from it "
                f"for {lease}), so its attempts were given up; connect again with a new Hello"
            )
        )
