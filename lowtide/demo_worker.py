"""`lowtide demo-worker`: a built-in worker with three activities, for trying lowtide out.

- `echo`: returns its payload.
- `sleep`: sleeps for the number of seconds in its payload (e.g. `0.5`), then returns it.
- `fail`: raises, with the payload as the message.
- `train`: stands for heavy, deferrable work: sleeps like `sleep` (the demo holds it while the
  grid signal is high).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from lowtide.heap import freeze_started
from lowtide.telemetry import resource, start_tracing
from lowtide_client import Worker

ACTIVITIES = ("echo", "sleep", "fail", "train")


class DemoFailure(Exception):
    """Raised by the `fail` activity."""


async def echo(payload: bytes) -> bytes:
    return payload


async def sleep(payload: bytes) -> bytes:
    text = payload.decode() or "1"
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"sleep: payload must be a number of seconds, got {text!r}") from None
    await asyncio.sleep(seconds)
    return payload


async def fail(payload: bytes) -> bytes:
    raise DemoFailure(payload.decode(errors="replace") or "failed on purpose")


async def run_demo_worker(
    *,
    target: str,
    pool: str,
    queues: list[str],
    types: list[str],
    slots: int,
    worker_id: str | None,
    security: Mapping[str, str] | None = None,
) -> None:
    """`security` is the worker token and TLS files (from LOWTIDE_TOKEN, LOWTIDE_CA, ...)."""
    functions = {"echo": echo, "sleep": sleep, "fail": fail, "train": sleep}
    unknown = set(types) - set(functions)
    if unknown:
        raise SystemExit(f"demo-worker: unknown type(s) {', '.join(sorted(unknown))}; have {', '.join(ACTIVITIES)}")
    security = security or {}
    worker = Worker(
        target=target,
        pool=pool,
        queues=queues,
        slots=slots,
        worker_id=worker_id,
        token=security.get("token"),
        ca=security.get("ca"),
        cert=security.get("cert"),
        key=security.get("key"),
    )
    for name in types:
        worker.register(name, functions[name])
    # Traced like the services when OTEL_TRACES_EXPORTER=otlp: each task's run joins its trace.
    traced = start_tracing(resource("lowtide-demo-worker"))
    freeze_started()
    try:
        await worker.run(install_signal_handlers=True)
    finally:
        if traced is not None:
            await asyncio.to_thread(traced[0].shutdown)
