"""One Procrastinate worker process: `python -m bench.procrastinate_worker ...`.

Started by `bench.procrastinate_bench` through `bench._fleet`; it exits by itself once the queue
is empty (`wait=False`).
"""

from __future__ import annotations

import argparse
import asyncio

from bench._handshake import database_url, ready_then_wait_for_go
from bench._procrastinate_app import make_app


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.procrastinate_worker")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--listen-notify", choices=("on", "off"), required=True)
    parser.add_argument("--fetch-job-polling-interval", type=float, required=True)
    parser.add_argument("--pool-size", type=int, required=True)
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> int:
    app = make_app(database_url(), pool_size=args.pool_size)
    async with app.open_async():
        if not await ready_then_wait_for_go():
            return 1
        await app.run_worker_async(
            wait=False,
            concurrency=args.concurrency,
            listen_notify=args.listen_notify == "on",
            fetch_job_polling_interval=args.fetch_job_polling_interval,
        )
    return 0


def main() -> None:
    raise SystemExit(asyncio.run(_main(_parse())))


if __name__ == "__main__":
    main()
