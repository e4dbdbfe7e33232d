"""The scheduler's gRPC health follows its database: NOT_SERVING while the database is
unreachable (its connections cut and new ones refused), SERVING again once it is back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import psycopg
from psycopg import conninfo

from lowtide.health import check_health
from scheduler_service.server import SERVICES, start_scheduler
from tests.conftest import make_config
from tests.helpers import eventually


def cut_off(admin_url: str, dbname: str, *, allow: bool) -> None:
    """Refuses (or allows again) new connections to the database and, when refusing, ends the
    open ones: the database is unreachable for the scheduler while the server stays up."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if not allow:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )


async def test_health_is_not_serving_while_the_database_is_unreachable(pg_server_url: str, database_url: str) -> None:
    dbname = conninfo.conninfo_to_dict(database_url)["dbname"]
    assert isinstance(dbname, str)
    scheduler = await start_scheduler(make_config(), database_url=database_url)
    try:

        async def status(service: str = "") -> str:
            return (await check_health(scheduler.target, service)).message.rsplit(": ", 1)[-1]

        assert await status() == "SERVING"
        cut_off(pg_server_url, dbname, allow=False)
        try:
            await eventually(lambda: _is(status, "NOT_SERVING"), within=30)
            # Every service the server reports on says so, not only the whole server.
            for service in SERVICES:
                assert await status(service) == "NOT_SERVING"
        finally:
            cut_off(pg_server_url, dbname, allow=True)
        await eventually(lambda: _is(status, "SERVING"), within=30)
        for service in SERVICES:
            assert await status(service) == "SERVING"
    finally:
        await scheduler.stop(grace=0.5)


async def _is(status: Callable[[], Awaitable[str]], wanted: str) -> bool:
    return await status() == wanted
