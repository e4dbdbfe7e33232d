"""lowtide.h2server seen by a bare HTTP/2 client (h2 on asyncio streams): what a grpc client never
does, so never shows — a deadline it leaves to the server, a request that is not gRPC, a stream
started after the server said GOAWAY."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
from hpack import Decoder
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, RstStreamFrame

from lowtide.h2server import Server
from lowtide.h2server.wire import frame

PROMPTLY = 5.0


class RawClient:
    """One HTTP/2 connection; `events()` reads until the server has said enough."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())

    def request(self, path: str, body: bytes, *, extra: list[tuple[bytes, bytes]] | None = None) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            *(extra or []),
        ]
        self.h2.send_headers(stream_id, headers)
        self.h2.send_data(stream_id, body, end_stream=True)
        self.flush()
        return stream_id

    async def until(self, done: Any) -> list[h2.events.Event]:
        """Events until `done(events)` holds (or the connection closes)."""
        seen: list[h2.events.Event] = []
        async with asyncio.timeout(PROMPTLY):
            while not done(seen):
                data = await self.reader.read(65536)
                if not data:
                    break
                seen += self.h2.receive_data(data)
                self.flush()
        return seen


def _headers(event: h2.events.Event) -> dict[bytes, bytes]:
    return {bytes(k): bytes(v) for k, v in getattr(event, "headers", None) or []}


def _ended(stream_id: int) -> Any:
    return lambda events: any(isinstance(e, h2.events.StreamEnded) and e.stream_id == stream_id for e in events)


@pytest.fixture
async def raw() -> AsyncIterator[tuple[Server, RawClient, asyncio.Event]]:
    cancelled = asyncio.Event()

    async def slow(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return request

    async def echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return request

    server = Server()
    handlers = {"Slow": grpc.unary_unary_rpc_method_handler(slow), "Echo": grpc.unary_unary_rpc_method_handler(echo)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Raw", handlers),))
    port = await server.bind("127.0.0.1:0")
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield server, RawClient(reader, writer), cancelled
    finally:
        writer.close()
        await server.stop(0)


async def test_the_server_ends_a_call_at_its_grpc_timeout_and_cancels_the_handler(
    raw: tuple[Server, RawClient, asyncio.Event],
) -> None:
    _, client, cancelled = raw
    stream = client.request("/test.Raw/Slow", frame(b"x"), extra=[(b"grpc-timeout", b"200m")])
    events = await client.until(_ended(stream))
    trailers = [_headers(e) for e in events if isinstance(e, h2.events.TrailersReceived | h2.events.ResponseReceived)]
    assert any(t.get(b"grpc-status") == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]).encode() for t in trailers)
    assert cancelled.is_set()


async def test_a_request_that_is_not_grpc_gets_an_http_status(raw: tuple[Server, RawClient, asyncio.Event]) -> None:
    _, client, _ = raw
    stream = client.h2.get_next_available_stream_id()
    client.h2.send_headers(
        stream,
        [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"localhost")],
        end_stream=True,
    )
    client.flush()
    events = await client.until(_ended(stream))
    assert [_headers(e)[b":status"] for e in events if isinstance(e, h2.events.ResponseReceived)] == [b"405"]
    json_call = client.request("/test.Raw/Echo", b"{}", extra=[(b"content-type", b"application/json")])
    events = await client.until(_ended(json_call))
    assert [_headers(e)[b":status"] for e in events if isinstance(e, h2.events.ResponseReceived)] == [b"415"]


async def _frames(client: RawClient, done: Any) -> list[Frame]:
    """The server's frames as they are, read until `done(frames)` holds. (h2 as a client stops
    reading at a GOAWAY, which is what is under test here.)"""
    buffer, frames = b"", list[Frame]()
    async with asyncio.timeout(PROMPTLY):
        while not done(frames):
            data = await client.reader.read(65536)
            if not data:
                break
            buffer += data
            while len(buffer) >= 9:
                parsed, length = Frame.parse_frame_header(memoryview(buffer[:9]))
                if len(buffer) < 9 + length:
                    break
                parsed.parse_body(memoryview(buffer[9 : 9 + length]))
                buffer = buffer[9 + length :]
                frames.append(parsed)
    return frames


async def test_after_goaway_a_new_stream_is_refused_and_one_in_progress_finishes(
    raw: tuple[Server, RawClient, asyncio.Event],
) -> None:
    server, client, _ = raw
    running = client.request("/test.Raw/Slow", frame(b"x"), extra=[(b"grpc-timeout", b"1S")])
    await asyncio.sleep(0.2)
    stopping = asyncio.create_task(server.stop(3))
    await asyncio.sleep(0.2)
    # Sent before this client has read the GOAWAY, as a request crossing it on the wire would be.
    late = client.request("/test.Raw/Echo", frame(b"late"))

    def running_ended(frames: list[Frame]) -> bool:
        return any(isinstance(f, HeadersFrame) and f.stream_id == running and "END_STREAM" in f.flags for f in frames)

    frames = await _frames(client, running_ended)
    goaways = [f for f in frames if isinstance(f, GoAwayFrame)]
    assert goaways and goaways[0].last_stream_id == running
    refused = [f for f in frames if isinstance(f, RstStreamFrame) and f.stream_id == late]
    assert refused and refused[0].error_code == h2.errors.ErrorCodes.REFUSED_STREAM
    # The call started before the GOAWAY ran to its own end (its deadline), not cut by it.
    (trailers,) = [f for f in frames if isinstance(f, HeadersFrame) and f.stream_id == running]
    assert dict(Decoder().decode(trailers.data, raw=True))[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED
    await stopping
