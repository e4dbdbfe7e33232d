"""A TCP relay in front of one service or several, whose connections can be cut: the soak puts
one in front of the scheduler replicas (as a load balancer), the fault tests one in front of a
service (as the network between two hosts)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence


class Relay:
    """Each connection goes to the next upstream that accepts it (round robin, as a load balancer
    sends it); a client that connects while none listens is cut off, as by a refused connection.
    With a `delay`, every byte leaves that long after it came, each way, in the order it came (as
    the network between two hosts: loopback answers in microseconds, which hides races that a
    round trip of a few milliseconds opens). `cut()` resets every connection it relays, as a
    network blip or a restarted proxy does; `upstream` may be changed, for the connections made
    after (a load balancer sending a client elsewhere). It outlives the services behind it."""

    def __init__(self, upstreams: str | Sequence[str], delay: float = 0.0, *, connect_within: float = 2.0) -> None:
        self.upstream = upstreams
        self._delay = delay
        self._connect_within = connect_within
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        # Connections relayed so far.
        self.connections = 0

    @property
    def upstream(self) -> str:
        """The upstream the next connection tries first."""
        return self._upstreams[self._next % len(self._upstreams)]

    @upstream.setter
    def upstream(self, upstreams: str | Sequence[str]) -> None:
        self._upstreams = [upstreams] if isinstance(upstreams, str) else list(upstreams)
        self._next = 0

    async def start(self) -> str:
        """Starts listening; returns the target clients connect to."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for _ in range(len(self._upstreams)):
            host, port = self.upstream.rsplit(":", 1)
            self._next += 1
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(asyncio.open_connection(host, int(port)), self._connect_within)
        return None

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            client_writer.transport.abort()
            return
        upstream_reader, upstream_writer = upstream
        self.connections += 1
        self._writers.update((client_writer, upstream_writer))
        for reader, writer in ((client_reader, upstream_writer), (upstream_reader, client_writer)):
            pipe = asyncio.create_task(self._pipe(reader, writer))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copies one direction until it ends or fails, then resets the other side."""
        loop = asyncio.get_running_loop()
        # Each chunk with the time it may leave; None (leaving as late) once the direction ended.
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer)) if self._delay else None
        try:
            while data := await reader.read(65536):
                if sender is None:
                    writer.write(data)
                    await writer.drain()
                else:
                    queue.put_nowait((loop.time() + self._delay, data))
        except (ConnectionError, OSError):
            pass
        finally:
            if sender is None:
                self._abort(writer)
            else:
                queue.put_nowait((loop.time() + self._delay, None))
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(sender)

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes | None]], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if data is None or writer.transport.is_closing():
                    return
                writer.write(data)
        finally:
            self._abort(writer)

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()
        self._writers.discard(writer)

    def cut(self) -> int:
        """Resets every connection relayed now, both ways (each side reads a reset, as when
        the network between them fails); returns how many there were."""
        live = [w for w in self._writers if not w.transport.is_closing()]
        self._writers.clear()
        for writer in live:
            writer.transport.abort()
        return len(live) // 2

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
