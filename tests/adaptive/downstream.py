"""A downstream that degrades under load, as a model server or a rate-limited API does:
`python -m tests.adaptive.downstream --capacity 20 --base-ms 200` (prints `listening PORT`).

Up to `capacity` requests at once each take `base-ms`; past it, with `over` requests beyond
capacity, each takes base x min(5, 1 + 4 x over / capacity) and fails (HTTP 503 with a JSON
error body and Retry-After, as an overloaded API answers) with probability min(0.5, 2 x over /
capacity). `GET /call` is the call; `GET /stats` the figures (requests, failures, peak
concurrency, in flight); `POST /reset` sets them to zero. HTTP/1.1 with keep-alive, on asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from dataclasses import asdict, dataclass

MAX_HEADER_BYTES = 16 * 1024


@dataclass
class Figures:
    requests: int = 0
    failures: int = 0
    peak: int = 0
    in_flight: int = 0


def slowdown(in_flight: int, capacity: int) -> float:
    over = max(0, in_flight - capacity)
    return min(5.0, 1.0 + 4.0 * over / capacity)


def failure_chance(in_flight: int, capacity: int) -> float:
    over = max(0, in_flight - capacity)
    return min(0.5, 2.0 * over / capacity)


class Downstream:
    def __init__(self, capacity: int, base_ms: float, seed: int | None = None) -> None:
        self.capacity = capacity
        self.base = base_ms / 1000
        self.figures = Figures()
        self._random = random.Random(seed)

    async def call(self) -> tuple[int, dict[str, object]]:
        figures = self.figures
        figures.in_flight += 1
        figures.requests += 1
        figures.peak = max(figures.peak, figures.in_flight)
        try:
            load = figures.in_flight
            await asyncio.sleep(self.base * slowdown(load, self.capacity))
            if self._random.random() < failure_chance(load, self.capacity):
                figures.failures += 1
                return 503, {"error": "overloaded", "in_flight": load}
            return 200, {"ok": True, "in_flight": load}
        finally:
            figures.in_flight -= 1

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                if len(head) > MAX_HEADER_BYTES:
                    return
                method, path = head.split(b" ", 2)[:2]
                if path == b"/call":
                    status, body = await self.call()
                elif path == b"/stats":
                    status, body = 200, asdict(self.figures)
                elif path == b"/reset" and method == b"POST":
                    in_flight = self.figures.in_flight
                    self.figures = Figures(in_flight=in_flight)
                    status, body = 200, {"reset": True}
                else:
                    status, body = 404, {"error": "not found"}
                payload = json.dumps(body).encode()
                reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
                extra = b"Retry-After: 1\r\n" if status == 503 else b""
                writer.write(
                    b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
                    % (status, reason.encode(), len(payload), extra)
                    + payload
                )
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser(prog="downstream")
    parser.add_argument("--capacity", type=int, default=20)
    parser.add_argument("--base-ms", type=float, default=200.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    downstream = Downstream(args.capacity, args.base_ms)
    server = await asyncio.start_server(downstream.serve, "127.0.0.1", args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
