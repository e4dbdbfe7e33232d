"""`python -m bench.drain_workers TARGET WORKERS SLOTS`: WORKERS lowtide workers (one stream
each, SLOTS slots, the no-op `echo` activity) in one process, until killed: the many small workers
of the drain benchmark, several streams per process as a host running many would have."""

from __future__ import annotations

import asyncio
import sys

from lowtide import event_loop
from lowtide_client import Worker


async def echo(payload: bytes) -> bytes:
    return payload


async def main(target: str, workers: int, slots: int) -> None:
    fleet = []
    for _ in range(workers):
        worker = Worker(target=target, slots=slots)
        worker.register("echo", echo)
        fleet.append(worker)
    await asyncio.gather(*(worker.run() for worker in fleet))


if __name__ == "__main__":
    # On the loop `lowtide demo-worker` runs on (uvloop), as the other systems' consumers run on theirs.
    event_loop.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
