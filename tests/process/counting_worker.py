"""A worker process for the process tests: `python -m tests.process.counting_worker --target T --out FILE`.

Activities:

- `count` appends its payload (a unique task number) and a newline to the output file, flushed
  at once, and returns the payload: the file is the record of which tasks ran, and how often.
- `hang` sleeps for 60 s, to be killed in the middle of it.
- `nap` appends its payload like `count`, then sleeps `--nap` seconds (default 0.5) before it
  returns it: an attempt that is surely under way once its line is in the file.

SIGTERM and SIGINT stop it gracefully, as `Worker.run(install_signal_handlers=True)` does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import TextIO

from lowtide_client import Worker


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="counting_worker")
    parser.add_argument("--target", required=True, help="scheduler address")
    parser.add_argument("--out", required=True, help="file each `count` payload is appended to")
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--worker-id")
    parser.add_argument("--nap", type=float, default=0.5, help="seconds a `nap` attempt sleeps")
    return parser


async def run(target: str, out: TextIO, slots: int, worker_id: str | None, nap_seconds: float = 0.5) -> None:
    worker = Worker(target=target, slots=slots, worker_id=worker_id)

    # Coroutine functions run on the event loop, one at a time between awaits, so the writes
    # never interleave and need no lock.
    @worker.activity("count")
    async def count(payload: bytes) -> bytes:
        out.write(payload.decode() + "\n")
        out.flush()
        return payload

    @worker.activity("hang")
    async def hang(payload: bytes) -> bytes:
        await asyncio.sleep(60)
        return payload

    @worker.activity("nap")
    async def nap(payload: bytes) -> bytes:
        out.write(payload.decode() + "\n")
        out.flush()
        await asyncio.sleep(nap_seconds)
        return payload

    await worker.run(install_signal_handlers=True)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOWTIDE_LOG_LEVEL", "WARNING").upper())
    with open(args.out, "a", encoding="utf-8") as out:
        asyncio.run(run(args.target, out, args.slots, args.worker_id, args.nap))


if __name__ == "__main__":
    main()
