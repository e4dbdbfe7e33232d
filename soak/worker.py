"""A soak worker: `python -m soak.worker --target T --id ID --out FILE [--pool P --queue Q]`.

Every activity writes a line to FILE when it begins and another when it ends (JSON: worker, pid,
task, attempt, and the time, with ok on the second), flushed at once: the record the checker
compares with the database. The activities, by the soak's load (soak.load):

- plain, defer, fixed: a short nap (up to the `soak-nap-ms` header); defer is cost-deferrable.
- flaky: fails with `Flaky` until the attempt reaches the `soak-fail-until` header.
- doomed: fails with `Doomed`, which its tasks name non-retryable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TextIO

from lowtide_client import Worker
from lowtide_client.activity import context

TYPES = ("plain", "defer", "flaky", "doomed")


class Flaky(Exception):
    """An attempt before the one its task says succeeds."""


class Doomed(Exception):
    """Every attempt of a doomed task fails; its tasks name this non-retryable."""


def _record(out: TextIO, worker: str, **fields: object) -> None:
    out.write(json.dumps({"w": worker, "p": os.getpid(), **fields}) + "\n")
    out.flush()


def _make_activity(out: TextIO, worker: str, name: str) -> Callable[[bytes], Awaitable[bytes]]:
    async def activity(payload: bytes) -> bytes:
        ctx = context()
        _record(out, worker, t=ctx.task_id, a=ctx.attempt, s=time.time())
        ok = False
        try:
            await asyncio.sleep(int(ctx.headers.get("soak-nap-ms", "0")) / 1000)
            if name == "flaky" and ctx.attempt < int(ctx.headers.get("soak-fail-until", "0")):
                raise Flaky(f"attempt {ctx.attempt} fails")
            if name == "doomed":
                raise Doomed("this task never succeeds")
            ok = True
            return b"ok"
        finally:
            _record(out, worker, t=ctx.task_id, a=ctx.attempt, e=time.time(), ok=ok)

    return activity


async def run(args: argparse.Namespace, out: TextIO) -> None:
    worker = Worker(target=args.target, pool=args.pool, queues=[args.queue], slots=args.slots, worker_id=args.id)
    for name in ("fixed",) if args.pool == "fixed" else TYPES:
        worker.activity(name)(_make_activity(out, args.id, name))
    await worker.run(install_signal_handlers=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="soak.worker")
    parser.add_argument("--target", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pool", default="default")
    parser.add_argument("--queue", default="default")
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with open(args.out, "a", encoding="utf-8") as out:
        asyncio.run(run(args, out))


if __name__ == "__main__":
    main()
