"""A worker process whose activity calls the downstream: `python -m tests.adaptive.caller
--target T --downstream URL --slots 50`. `call_api` GETs URL/call; an HTTP 503 is raised as a
retryable error (an overloaded downstream may answer next time), anything else non-2xx too."""

from __future__ import annotations

import argparse
import asyncio

import httpx

from lowtide_client import Worker


class Overloaded(Exception):
    """The downstream answered 503."""


async def run(target: str, downstream: str, slots: int) -> None:
    worker = Worker(target=target, slots=slots)
    limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
    async with httpx.AsyncClient(base_url=downstream, limits=limits, timeout=30.0) as http:

        @worker.activity("call_api")
        async def call_api(payload: bytes) -> bytes:
            response = await http.get("/call")
            if response.status_code == 503:
                raise Overloaded(response.text)
            response.raise_for_status()
            return response.content

        await worker.run(install_signal_handlers=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="caller")
    parser.add_argument("--target", required=True)
    parser.add_argument("--downstream", required=True)
    parser.add_argument("--slots", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(run(args.target, args.downstream, args.slots))


if __name__ == "__main__":
    main()
