"""The scheduler's gRPC health follows its database: NOT_SERVING while the database does not
answer, SERVING again once it does. A scheduler without its database can take no submit, claim
or report, so a load balancer or an orchestrator should send its clients elsewhere meanwhile.

The database is asked once per interval on a connection of its own (see `Database.ping`): a busy
pool does not read as an outage, and an idle scheduler costs one trivial query per interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import timedelta

from grpc_health.v1 import health, health_pb2

from lowtide.db import Database
from scheduler_service.store import Q

log = logging.getLogger("lowtide.scheduler.health")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def follow_database(
    db: Database, servicer: health.aio.HealthServicer, services: Iterable[str], *, interval: timedelta
) -> None:
    """Runs until cancelled: sets `services` NOT_SERVING while `db` does not answer within the
    interval (at least a second), SERVING when it does again."""
    names = list(services)
    period = interval.total_seconds()
    serving = True
    while True:
        problem = await db.ping(Q["now"], within=max(1.0, period))
        if (problem is None) != serving:
            serving = problem is None
            if serving:
                log.info("health.serving", extra={"detail": "the database answers again"})
            else:
                log.warning("health.not_serving", extra={"detail": f"the database does not answer: {problem}"})
            for name in names:
                await servicer.set(name, SERVING if serving else NOT_SERVING)
        await asyncio.sleep(period)
