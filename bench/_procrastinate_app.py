"""The Procrastinate app both the deferring parent and the worker processes build."""

from __future__ import annotations

import procrastinate

TASK_NAME = "bench.noop"


def make_app(database_url: str, pool_size: int) -> procrastinate.App:
    # min_size == max_size: the pool is filled while the worker opens the app, before it reports
    # ready, so connection set-up is not timed and no job waits for a connection to be made.
    connector = procrastinate.PsycopgConnector(conninfo=database_url, min_size=pool_size, max_size=pool_size)
    app = procrastinate.App(connector=connector)

    # Async, because a sync task would go through a thread per job (sync_to_async).
    @app.task(name=TASK_NAME)  # type: ignore[untyped-decorator]
    async def noop() -> None:
        return None

    return app
