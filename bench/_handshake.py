"""The worker side of the protocol in `bench._fleet`: where the database is, and when to start."""

from __future__ import annotations

import asyncio
import os
import sys

READY = "ready"
GO = "go"
DATABASE_URL_ENV = "BENCH_WORKER_DATABASE_URL"


def database_url() -> str:
    """The URL of the run's database, as `bench._fleet` hands it to its workers."""
    return os.environ[DATABASE_URL_ENV]


async def ready_then_wait_for_go() -> bool:
    """Tell the parent we are ready; True once it says go, False if it went away instead.

    A thread reads stdin so the event loop (and the library's open connections) stay live.
    """
    print(READY, flush=True)
    line: str = await asyncio.to_thread(sys.stdin.readline)
    # The parent reads nothing more from our stdout; anything printed there from now on would
    # fill the pipe and block us, so stdout becomes a second stderr (C-level writes included).
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return line.strip() == GO
