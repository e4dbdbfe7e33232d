"""The event loop lowtide's processes run on: uvloop where it is installed, asyncio's own otherwise.

Every lowtide command (the services, `lowtide up`, `lowtide demo-worker`, the CLI) runs its
coroutine through `run()`. uvloop (libuv under the asyncio API) takes less CPU to wake up for each
event than asyncio's selector loop, and a service here wakes for every gRPC completion (grpc.aio's
poller hands each one to the loop through a file descriptor) and every database answer: at 100
single submits a second the scheduler spent 14 % less CPU a task on it, and at 300 a second its
submit p99 halved (docs/explanation/performance-log.md, "On uvloop").
It is a dependency wherever it builds (not on Windows). `LOWTIDE_EVENT_LOOP=asyncio` chooses
asyncio's own loop (to rule the loop out when chasing a problem); `uvloop` requires it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from lowtide.errors import ConfigError

T = TypeVar("T")

VARIABLE = "LOWTIDE_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


def loop_factory(env: Mapping[str, str] = os.environ) -> Callable[[], asyncio.AbstractEventLoop]:
    """The factory of the loop `env` asks for: uvloop's when it is installed and not refused."""
    given = env.get(VARIABLE, "")
    asked = given.strip().lower()
    if asked not in ("", *CHOICES):
        raise ConfigError(f"{VARIABLE}: must be one of {', '.join(CHOICES)}, not {given!r}")
    if asked == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if asked == "uvloop":
            raise ConfigError(f"{VARIABLE}=uvloop, but uvloop is not installed (pip install uvloop)") from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the loop the environment asks for."""
    try:
        factory = loop_factory()
    except BaseException:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
