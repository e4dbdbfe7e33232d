"""Worker leases, renewed per replica: one statement per tick for every session heard from.

Why it works this way: docs/architecture/fleet.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from lowtide.errors import DatabaseUnavailable, Unavailable
from lowtide_proto.durations import format_duration
from scheduler_service.domain.leases import LeaseTerms, renewal
from scheduler_service.fleet.heartbeats import HeartbeatDeadlines
from scheduler_service.fleet.sessions import Registry, WorkerSession
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
        idle_heartbeat_interval: timedelta,
    ) -> None:
        self._store = store
        self._registry = registry
        self._scheduler_id = scheduler_id
        self._lease = lease_timeout
        self._terms = LeaseTerms.of(lease_timeout=lease_timeout, idle_heartbeat_interval=idle_heartbeat_interval)
        self._tick = heartbeat_interval.total_seconds() / 2
        # Renewal statements run (one per tick with any session heard from or changed).
        self.renewals = 0
        # The heartbeat deadlines of running attempts, written beside (see fleet/heartbeats.py).
        self.beats = HeartbeatDeadlines(store)

    async def run(self) -> None:
        await asyncio.gather(self._renewing(), self.beats.run())

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            await self.renew()

    async def renew(self) -> None:
        """Renews the leases of every session heard from since the last renewal, and of those
        whose lease length changed; ends those whose lease was gone."""
        now = time.monotonic()
        due: dict[str, tuple[int, int]] = {}
        # The sessions heard from, among those renewed.
        sessions: list[WorkerSession] = []
        for session in self._registry:
            if session.closed:
                continue
            heard = session.lease.heard
            left = renewal(session.lease, busy=bool(session.in_flight), slots=session.slots, now=now, terms=self._terms)
            if left is None or left <= 0:
                # Nothing changed, or silent past its lease (which ran out in the database too):
                # it gets no work, and its next heartbeat (if any) ends its stream.
                continue
            if heard:
                sessions.append(session)
            due[session.worker_id] = (session.slots, round(left * 1000))
        if not due:
            return
        try:
            self.renewals += 1
            renewed = await self._store.renew_workers(due, self._scheduler_id)
        except DatabaseUnavailable as error:
            # A busy pool or a database restart is not the workers' fault: their streams stay,
            # and the next tick renews the leases (or finds them gone).
            log.warning("worker.heartbeat_deferred", extra={"workers": len(due), "error": str(error)})
            for session in sessions:
                session.lease.heard = True
            for session in self._registry:
                if session.worker_id in due and not session.lease.heard:
                    session.lease.leased_slots = -1  # unknown: renewed on the next tick
            return
        # A worker heard from whose lease was gone ends (UNAVAILABLE); one renewed only because its
        # lease length changed is left to its next heartbeat, which then finds the lease gone.
        for session in sessions:
            if session.worker_id not in renewed and not session.closed:
                self._lost(session)

    def _lost(self, session: WorkerSession) -> None:
        seconds = self._terms.busy if session.lease.leased_busy else self._terms.idle
        lease = format_duration(timedelta(seconds=seconds))
        session.lost_reason = f"the worker's lease ran out (nothing heard from it for {lease})"
        session.end(
            Unavailable(
                f"worker {session.worker_id}: its lease ran out before this heartbeat (nothing heard from it "
                f"for {lease}), so its attempts were given up; connect again with a new Hello"
            )
        )
