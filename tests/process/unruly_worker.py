"""A worker process whose activities misbehave in every way an activity can end:
`python -m tests.process.unruly_worker --target T`.

- `dict` returns a dict from an untyped activity (no bytes, str or None to send);
- `exit` calls sys.exit() in a plain function (run in a thread), `exit_async` raises SystemExit
  on the event loop;
- `unprintable` raises an exception whose str() raises;
- `fine` returns its payload: the worker is still there to run it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from lowtide_client import Worker


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


async def run(target: str) -> None:
    worker = Worker(target=target, slots=2)

    @worker.activity("dict")
    def as_dict(payload: bytes) -> object:
        return {"loss": 0.025}

    @worker.activity("exit")
    def leave(payload: bytes) -> bytes:
        sys.exit(3)

    @worker.activity("exit_async")
    async def leave_async(payload: bytes) -> bytes:
        raise SystemExit(4)

    @worker.activity("unprintable")
    async def unprintable(payload: bytes) -> bytes:
        raise Unprintable

    @worker.activity("fine")
    async def fine(payload: bytes) -> bytes:
        return payload

    await worker.run(install_signal_handlers=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="unruly_worker")
    parser.add_argument("--target", required=True)
    asyncio.run(run(parser.parse_args().target))


if __name__ == "__main__":
    main()
