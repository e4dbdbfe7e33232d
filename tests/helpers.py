"""Small helpers the tests share: polling for a condition, and worker processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], *, within: float = 10.0, interval: float = 0.05) -> T:
    """Calls probe until it returns something truthy, or fails after `within` seconds with the last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s (last value: {value!r})")
        await asyncio.sleep(interval)


def worker_process(target: str, *args: str) -> subprocess.Popen[bytes]:
    """Runs `lowtide demo-worker` as a separate process, as a user would."""
    env = dict(os.environ, LOWTIDE_LOG_LEVEL="WARNING")
    return subprocess.Popen(
        [sys.executable, "-m", "lowtide", "demo-worker", "--target", target, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
