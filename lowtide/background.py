"""Ending background tasks for good."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_all(tasks: Iterable[asyncio.Task[Any]], *, again_after: float = 0.5) -> None:
    """Cancels the tasks and waits until every one has ended, cancelling again those still
    running after `again_after` seconds.

    Once is not always enough: on Python 3.11 `asyncio.wait_for` (psycopg_pool waits for a
    connection with it) swallows a cancellation that arrives as its inner wait completes, and a
    loop that then catches its own errors goes round forever, hanging whoever awaits it (seen
    as a scheduler stop hanging in about one test run in three)."""
    pending = set(tasks)
    every = list(pending)
    for task in pending:
        task.cancel()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=again_after)
        for task in pending:
            task.cancel()
    for task in every:
        # Collected so that an error a task ended with is not reported as never retrieved.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
