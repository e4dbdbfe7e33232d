"""lowtide.h2server.Server against real grpc.aio clients over loopback: what a caller of a service
served by it sees (statuses, metadata, streaming, flow control, deadlines, cancellation, stop)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import wrappers_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

from lowtide.h2server import Server
from lowtide.h2server.call import Context
from lowtide_client._proto.lowtide.v1 import signal_pb2, signal_pb2_grpc

SERVICE = "test.Echo"
MB = 1024 * 1024
# How long "promptly" may take on a loaded machine: a bound for hangs, not a measurement.
PROMPTLY = 5.0

Handlers = Mapping[str, grpc.RpcMethodHandler]
# grpc's client grants a 4 MB window and takes frames of up to 4 MB; with these it grants HTTP/2's
# initial 64 KB (and no more: no bandwidth probing) and takes frames of 16 KB.
SMALL_WINDOWS = [
    ("grpc.http2.lookahead_bytes", 65535),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.max_frame_size", 16384),
]


@dataclass
class Running:
    """A started server with the test's handlers, and the channels the test opened to it."""

    server: Server
    target: str
    channels: list[Any] = field(default_factory=list)

    def channel(self, **kwargs: Any) -> Any:
        channel = grpc.aio.insecure_channel(self.target, **kwargs)
        self.channels.append(channel)
        return channel


Serve = Callable[..., Awaitable[Running]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Starts a Server on 127.0.0.1:0 serving `SERVICE` with the given method handlers (and
    whatever `setup` adds); closes the channels and stops the servers after the test."""
    started: list[Running] = []

    async def start(
        methods: Handlers,
        *,
        setup: Callable[[Server], None] | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> Running:
        server = Server(interceptors=interceptors)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, dict(methods)),))
        if setup is not None:
            setup(server)
        port = await server.bind("127.0.0.1:0")
        await server.start()
        running = Running(server, f"127.0.0.1:{port}")
        started.append(running)
        return running

    yield start
    for running in started:
        for channel in running.channels:
            await channel.close()
        await running.server.stop(0)


def path(method: str) -> str:
    return f"/{SERVICE}/{method}"


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await asyncio.wait_for(call, PROMPTLY)
    code: grpc.StatusCode = raised.value.code()
    return code


async def read_all(call: Any, *, within: float = PROMPTLY) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [message async for message in call]

    return await asyncio.wait_for(collect(), within)


def numbered(i: int, size: int) -> bytes:
    """Message `i`, `size` bytes long, that says which it is."""
    return i.to_bytes(4, "big") * (size // 4) + b"\xee" * (size % 4)


# 1. Unary calls: round trip, metadata, abort, unexpected errors, unknown methods.


async def test_unary_round_trip_with_metadata_both_ways(serve: Serve) -> None:
    seen: list[tuple[str, str | bytes]] = []

    async def greet(request: wrappers_pb2.StringValue, context: Context) -> wrappers_pb2.StringValue:
        seen.extend(context.invocation_metadata())
        await context.send_initial_metadata((("x-initial", "early"), ("x-initial-bin", b"\x00\x01")))
        context.set_trailing_metadata((("x-trailing", "late"), ("x-trailing-bin", b"\xff")))
        return wrappers_pb2.StringValue(value=f"hello, {request.value}")

    running = await serve(
        {
            "Greet": grpc.unary_unary_rpc_method_handler(
                greet,
                request_deserializer=wrappers_pb2.StringValue.FromString,
                response_serializer=wrappers_pb2.StringValue.SerializeToString,
            )
        }
    )
    stub = running.channel().unary_unary(
        path("Greet"),
        request_serializer=wrappers_pb2.StringValue.SerializeToString,
        response_deserializer=wrappers_pb2.StringValue.FromString,
    )
    sent: list[tuple[str, str | bytes]] = [
        ("x-text", "some text"),
        # Binary values of 1, 2 and 3 bytes: base64 without padding of each length.
        ("x-one-bin", b"\x00"),
        ("x-two-bin", b"\x00\xff"),
        ("x-three-bin", b"\xde\xad\xbe"),
        ("x-text", "a second value"),
    ]
    call = stub(wrappers_pb2.StringValue(value="température"), metadata=sent, timeout=PROMPTLY)
    response = await call
    assert response.value == "hello, température"
    # (grpc's client groups the values of one key together; their order is kept.)
    for key in ("x-text", "x-one-bin", "x-two-bin", "x-three-bin"):
        assert [value for k, value in seen if k == key] == [value for k, value in sent if k == key]
    assert (await call.code()) == grpc.StatusCode.OK
    initial = await call.initial_metadata()
    assert (initial.get_all("x-initial"), initial.get_all("x-initial-bin")) == (["early"], [b"\x00\x01"])
    trailing = await call.trailing_metadata()
    assert (trailing.get_all("x-trailing"), trailing.get_all("x-trailing-bin")) == (["late"], [b"\xff"])


@pytest.mark.parametrize(
    "message",
    [
        "plain words",
        "température > 400 °C",
        "100% sure\nsecond line",
        # What would read as percent-escapes if the server sent it unescaped.
        "literally %41 and %25, not A and %",
        "🔥 ünïcödé ‰",
    ],
)
async def test_abort_reaches_the_client_with_its_code_exact_message_and_trailing_metadata(
    serve: Serve, message: str
) -> None:
    async def refuse(request: bytes, context: Context) -> bytes:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            message,
            trailing_metadata=(("x-reason", "too hot"), ("x-limit-bin", b"\x01\x90")),
        )

    running = await serve({"Refuse": grpc.unary_unary_rpc_method_handler(refuse)})
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await running.channel().unary_unary(path("Refuse"))(b"", timeout=PROMPTLY)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert raised.value.details() == message
    trailing = raised.value.trailing_metadata()
    assert (trailing.get_all("x-reason"), trailing.get_all("x-limit-bin")) == (["too hot"], [b"\x01\x90"])


async def test_abort_in_a_server_stream_after_messages(serve: Serve) -> None:
    async def some_then_abort(request: bytes, context: Context) -> AsyncIterator[bytes]:
        yield b"one"
        yield b"two"
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota: 2 messages")

    running = await serve({"Stream": grpc.unary_stream_rpc_method_handler(some_then_abort)})
    call = running.channel().unary_stream(path("Stream"))(b"", timeout=PROMPTLY)
    received = [await call.read(), await call.read()]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert received == [b"one", b"two"]
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "quota: 2 messages")


async def test_an_unexpected_exception_is_unknown_and_the_server_keeps_serving(serve: Serve) -> None:
    async def fragile(request: bytes, context: Context) -> bytes:
        if request == b"fail":
            raise RuntimeError("boom")
        return b"fine: " + request

    async def fragile_stream(request: bytes, context: Context) -> AsyncIterator[bytes]:
        yield b"first"
        raise KeyError("gone")

    running = await serve(
        {
            "Fragile": grpc.unary_unary_rpc_method_handler(fragile),
            "FragileStream": grpc.unary_stream_rpc_method_handler(fragile_stream),
        }
    )
    channel = running.channel()
    stub = channel.unary_unary(path("Fragile"))
    assert await code_of(stub(b"fail")) == grpc.StatusCode.UNKNOWN
    assert await stub(b"again", timeout=PROMPTLY) == b"fine: again"

    call = channel.unary_stream(path("FragileStream"))(b"", timeout=PROMPTLY)
    assert await call.read() == b"first"
    assert await code_of(call.read()) == grpc.StatusCode.UNKNOWN
    assert await stub(b"still", timeout=PROMPTLY) == b"fine: still"


async def test_set_code_ends_the_call_with_that_status_whatever_the_handler_returns(serve: Serve) -> None:
    """As on grpc.aio's server: a handler that sets a non-OK code and returns (the response,
    often None, is dropped), or sets one and then raises, ends the call with that code."""

    async def missing(request: wrappers_pb2.StringValue, context: Context) -> wrappers_pb2.StringValue | None:
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details(f"no signal {request.value!r}")
        context.set_trailing_metadata((("x-known", "price"),))
        return None

    async def failing(request: wrappers_pb2.StringValue, context: Context) -> wrappers_pb2.StringValue:
        context.set_code(grpc.StatusCode.UNAVAILABLE)
        context.set_trailing_metadata((("x-retry-after", "1"),))
        raise ConnectionError("database down")

    def handler(behaviour: Callable[..., Awaitable[Any]]) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            behaviour,
            request_deserializer=wrappers_pb2.StringValue.FromString,
            response_serializer=wrappers_pb2.StringValue.SerializeToString,
        )

    # A servicer that implements nothing: the generated base class sets UNIMPLEMENTED and raises.
    running = await serve(
        {"Missing": handler(missing), "Failing": handler(failing)},
        setup=lambda server: signal_pb2_grpc.add_SignalServiceServicer_to_server(
            # Abstract in the type stubs; at run time every method answers UNIMPLEMENTED.
            signal_pb2_grpc.SignalServiceServicer(),  # type: ignore[abstract]
            server,
        ),
    )
    channel = running.channel()

    def stub(method: str) -> Any:
        return channel.unary_unary(
            path(method),
            request_serializer=wrappers_pb2.StringValue.SerializeToString,
            response_deserializer=wrappers_pb2.StringValue.FromString,
        )

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub("Missing")(wrappers_pb2.StringValue(value="carbon"), timeout=PROMPTLY)
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.NOT_FOUND, "no signal 'carbon'")
    assert raised.value.trailing_metadata().get_all("x-known") == ["price"]

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub("Failing")(wrappers_pb2.StringValue(value="x"), timeout=PROMPTLY)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "database down" in raised.value.details()
    assert raised.value.trailing_metadata().get_all("x-retry-after") == ["1"]

    signals = signal_pb2_grpc.SignalServiceStub(channel)
    get_signal = signals.GetSignal(signal_pb2.GetSignalRequest(name="price"), timeout=PROMPTLY)
    assert await code_of(get_signal) == grpc.StatusCode.UNIMPLEMENTED


async def test_trailing_metadata_that_cannot_be_sent_ends_the_call_internal(serve: Serve) -> None:
    """A handler's mistake in its trailing metadata fails the call (as on grpc.aio's server),
    it does not leave the client waiting for a status that never comes."""

    async def bad_trailers(request: bytes, context: Context) -> bytes:
        context.set_trailing_metadata((("x-note", "on fire 🔥"),))
        return b"ok"

    async def bad_abort(request: bytes, context: Context) -> bytes:
        await context.abort(grpc.StatusCode.NOT_FOUND, "gone", trailing_metadata=(("x-note", "🔥"),))

    async def echo(request: bytes, context: Context) -> bytes:
        return request

    running = await serve(
        {
            "BadTrailers": grpc.unary_unary_rpc_method_handler(bad_trailers),
            "BadAbort": grpc.unary_unary_rpc_method_handler(bad_abort),
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
        }
    )
    channel = running.channel()
    for method in ("BadTrailers", "BadAbort"):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await channel.unary_unary(path(method))(b"", timeout=PROMPTLY)
        assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INTERNAL, "Invalid metadata")
    assert await channel.unary_unary(path("Echo"))(b"fine", timeout=PROMPTLY) == b"fine"


async def test_a_unary_method_called_with_no_or_two_requests_is_internal_and_not_run(serve: Serve) -> None:
    ran: list[bytes] = []

    async def once(request: bytes, context: Context) -> bytes:
        ran.append(request)
        return request

    running = await serve({"Once": grpc.unary_unary_rpc_method_handler(once)})
    channel = running.channel()
    # The same path called as client-streaming: the client decides how many messages it sends.
    as_stream = channel.stream_unary(path("Once"))
    assert await code_of(as_stream(iter([]))) == grpc.StatusCode.INTERNAL
    assert await code_of(as_stream(iter([b"one", b"two"]))) == grpc.StatusCode.INTERNAL
    assert ran == []
    assert await as_stream(iter([b"just one"]), timeout=PROMPTLY) == b"just one"


async def test_an_unknown_method_or_service_is_unimplemented(serve: Serve) -> None:
    async def known(request: bytes, context: Context) -> bytes:
        return request

    running = await serve({"Known": grpc.unary_unary_rpc_method_handler(known)})
    channel = running.channel()
    assert await code_of(channel.unary_unary(path("Unknown"))(b"")) == grpc.StatusCode.UNIMPLEMENTED
    assert await code_of(channel.unary_unary("/no.Such/Service")(b"")) == grpc.StatusCode.UNIMPLEMENTED
    stream = channel.stream_stream("/no.Such/Stream")()
    assert await code_of(stream.read()) == grpc.StatusCode.UNIMPLEMENTED
    assert await channel.unary_unary(path("Known"))(b"ok", timeout=PROMPTLY) == b"ok"


async def test_interceptors_see_every_call_and_can_refuse_it(serve: Serve) -> None:
    seen: list[str] = []

    async def deny(request: bytes, context: Context) -> bytes:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")

    class TokenRequired(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        async def intercept_service(
            self,
            continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails,
        ) -> grpc.RpcMethodHandler:
            seen.append(details.method)
            if ("authorization", "Bearer good") not in tuple(details.invocation_metadata):
                return grpc.unary_unary_rpc_method_handler(deny)
            return await continuation(details)

    async def echo(request: bytes, context: Context) -> bytes:
        return request

    running = await serve({"Echo": grpc.unary_unary_rpc_method_handler(echo)}, interceptors=[TokenRequired()])
    stub = running.channel().unary_unary(path("Echo"))
    assert await code_of(stub(b"x")) == grpc.StatusCode.UNAUTHENTICATED
    assert await stub(b"y", metadata=(("authorization", "Bearer good"),), timeout=PROMPTLY) == b"y"
    assert seen == [path("Echo"), path("Echo")]


# 2. Streaming, in every direction and both handler styles.


async def test_server_streaming_as_an_async_generator_and_as_a_coroutine_that_writes(serve: Serve) -> None:
    async def generated(request: bytes, context: Context) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield b"gen %d" % i

    async def written(request: bytes, context: Context) -> None:
        for i in range(int(request)):
            await context.write(b"wrote %d" % i)

    running = await serve(
        {
            "Generated": grpc.unary_stream_rpc_method_handler(generated),
            "Written": grpc.unary_stream_rpc_method_handler(written),
        }
    )
    channel = running.channel()
    assert await read_all(channel.unary_stream(path("Generated"))(b"50")) == [b"gen %d" % i for i in range(50)]
    assert await read_all(channel.unary_stream(path("Written"))(b"50")) == [b"wrote %d" % i for i in range(50)]
    # No messages at all is a stream too.
    empty = channel.unary_stream(path("Written"))(b"0")
    assert await read_all(empty) == []
    assert await empty.code() == grpc.StatusCode.OK


async def test_client_streaming_by_iterator_and_by_context_read(serve: Serve) -> None:
    async def joined(requests: AsyncIterator[bytes], context: Context) -> bytes:
        return b"|".join([request async for request in requests])

    async def counted(requests: AsyncIterator[bytes], context: Context) -> bytes:
        total = 0
        while (message := await context.read()) is not grpc.aio.EOF:
            total += len(message)
        return str(total).encode()

    running = await serve(
        {
            "Joined": grpc.stream_unary_rpc_method_handler(joined),
            "Counted": grpc.stream_unary_rpc_method_handler(counted),
        }
    )
    channel = running.channel()

    async def requests() -> AsyncIterator[bytes]:
        for i in range(20):
            yield b"r%d" % i

    joined_call = channel.stream_unary(path("Joined"))(requests(), timeout=PROMPTLY)
    assert await joined_call == b"|".join(b"r%d" % i for i in range(20))

    counted_call = channel.stream_unary(path("Counted"))(timeout=PROMPTLY)
    for size in (0, 1, 100, 70_000):
        await counted_call.write(b"z" * size)
    await counted_call.done_writing()
    assert await counted_call == b"70101"


async def test_bidirectional_echo_answers_each_message_before_the_next_is_sent(serve: Serve) -> None:
    async def echo(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
        async for request in requests:
            yield b"echo " + request

    running = await serve({"Echo": grpc.stream_stream_rpc_method_handler(echo)})
    call = running.channel().stream_stream(path("Echo"))(timeout=PROMPTLY * 2)
    for i in range(30):
        await call.write(b"%d" % i)
        # The answer arrives while the request stream is still open.
        assert await asyncio.wait_for(call.read(), PROMPTLY) == b"echo %d" % i
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


# 3. Messages larger than the windows and the frame size.


async def test_large_messages_arrive_intact_both_ways(serve: Serve) -> None:
    async def echo(request: bytes, context: Context) -> bytes:
        return request

    async def big(request: bytes, context: Context) -> bytes:
        return random.Random(int(request)).randbytes(3 * MB)

    async def big_stream(request: bytes, context: Context) -> AsyncIterator[bytes]:
        for i in range(6):
            yield numbered(i, MB + 7)

    running = await serve(
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Big": grpc.unary_unary_rpc_method_handler(big),
            "BigStream": grpc.unary_stream_rpc_method_handler(big_stream),
        }
    )
    for channel in (running.channel(), running.channel(options=SMALL_WINDOWS)):
        # 3 MB in one message: over HTTP/2's 64 KB window and 16 KB frames (SMALL_WINDOWS).
        big_call = channel.unary_unary(path("Big"))(b"7", timeout=PROMPTLY * 2)
        assert await big_call == random.Random(7).randbytes(3 * MB)
        # 6 MB in a stream: past the 4 MB window grpc's client grants by default.
        stream = channel.unary_stream(path("BigStream"))(b"", timeout=PROMPTLY * 2)
        assert await read_all(stream, within=PROMPTLY * 2) == [numbered(i, MB + 7) for i in range(6)]
        # A request past the server's 1 MB window, under the 4 MB limit.
        payload = random.Random(8).randbytes(3 * MB + 1)
        assert await channel.unary_unary(path("Echo"))(payload, timeout=PROMPTLY * 2) == payload


# 4. The receive limit and compression.


async def test_a_request_over_4_mb_is_resource_exhausted_and_the_server_keeps_serving(serve: Serve) -> None:
    reached: list[int] = []

    async def size(request: bytes, context: Context) -> bytes:
        reached.append(len(request))
        return str(len(request)).encode()

    running = await serve({"Size": grpc.unary_unary_rpc_method_handler(size)})
    channel = running.channel()
    stub = channel.unary_unary(path("Size"))
    assert await stub(b"x" * (4 * MB), timeout=PROMPTLY) == str(4 * MB).encode()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub(b"x" * (4 * MB + 1), timeout=PROMPTLY)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reached == [4 * MB]
    assert await stub(b"small", timeout=PROMPTLY) == b"5"


async def test_a_gzip_compressed_request_is_accepted(serve: Serve) -> None:
    async def echo(request: bytes, context: Context) -> bytes:
        return request

    async def compressed(request: bytes, context: Context) -> AsyncIterator[bytes]:
        context.set_compression(grpc.Compression.Gzip)
        for i in range(3):
            yield b"%d" % i * 100_000

    running = await serve(
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Compressed": grpc.unary_stream_rpc_method_handler(compressed),
        }
    )
    # Responses compressed by the server (set_compression) are read as they were.
    plain_channel = running.channel()
    assert await read_all(plain_channel.unary_stream(path("Compressed"))(b"")) == [
        b"%d" % i * 100_000 for i in range(3)
    ]
    channel = running.channel(compression=grpc.Compression.Gzip)
    stub = channel.unary_unary(path("Echo"))
    payload = b"a compressible reading, " * 40_000  # ~1 MB, a few KB compressed
    assert await stub(payload, timeout=PROMPTLY) == payload
    # Under the limit on the wire, over it once inflated.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub(b"\x00" * (5 * MB), timeout=PROMPTLY)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # One call compressed, the next not, on the same channel.
    assert await stub(b"plain", timeout=PROMPTLY, compression=grpc.Compression.NoCompression) == b"plain"


# 5, 6. Deadlines and cancellation reach the handler.


async def test_a_deadline_is_deadline_exceeded_and_cancels_the_handler(serve: Serve) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    remaining: list[float | None] = []

    async def slow(request: bytes, context: Context) -> bytes:
        remaining.append(context.time_remaining())
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b"too late"

    running = await serve({"Slow": grpc.unary_unary_rpc_method_handler(slow)})
    channel = running.channel()
    await asyncio.wait_for(channel.channel_ready(), PROMPTLY)  # connecting is not part of the deadline's test
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await asyncio.wait_for(channel.unary_unary(path("Slow"))(b"", timeout=1.0), PROMPTLY)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert started.is_set()
    await asyncio.wait_for(cancelled.wait(), PROMPTLY)
    # The handler was told the deadline (grpc's client rounds the timeout it sends up a little).
    assert remaining[0] is not None
    assert 0 < remaining[0] < 1.5


async def test_a_deadline_ends_a_server_stream_and_cancels_its_handler(serve: Serve) -> None:
    cancelled = asyncio.Event()

    async def stuck(request: bytes, context: Context) -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await asyncio.sleep(30)
        finally:
            cancelled.set()

    running = await serve({"Stuck": grpc.unary_stream_rpc_method_handler(stuck)})
    channel = running.channel()
    await asyncio.wait_for(channel.channel_ready(), PROMPTLY)
    call = channel.unary_stream(path("Stuck"))(b"", timeout=1.0)
    assert await call.read() == b"first"
    assert await code_of(call.read()) == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(cancelled.wait(), PROMPTLY)


async def test_a_client_cancelling_a_server_stream_cancels_the_handler(serve: Serve) -> None:
    cancelled = asyncio.Event()
    ended: list[bool] = []

    async def forever(request: bytes, context: Context) -> AsyncIterator[bytes]:
        context.add_done_callback(lambda _: ended.append(context.cancelled()))
        try:
            i = 0
            while True:
                yield b"%d" % i
                i += 1
                await asyncio.sleep(0.01)
        finally:
            cancelled.set()

    async def echo(request: bytes, context: Context) -> bytes:
        return request

    running = await serve(
        {"Forever": grpc.unary_stream_rpc_method_handler(forever), "Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    channel = running.channel()
    call = channel.unary_stream(path("Forever"))(b"")
    assert [await call.read() for _ in range(3)] == [b"0", b"1", b"2"]
    call.cancel()
    await asyncio.wait_for(cancelled.wait(), PROMPTLY)
    assert call.cancelled()
    assert ended == [True]
    # The connection is still good for other calls.
    assert await channel.unary_unary(path("Echo"))(b"next", timeout=PROMPTLY) == b"next"


async def test_a_client_cancelling_a_bidi_stream_cancels_a_handler_waiting_for_requests(serve: Serve) -> None:
    cancelled = asyncio.Event()

    async def chat(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
        try:
            async for request in requests:
                yield request
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = await serve({"Chat": grpc.stream_stream_rpc_method_handler(chat)})
    call = running.channel().stream_stream(path("Chat"))()
    await call.write(b"hi")
    assert await asyncio.wait_for(call.read(), PROMPTLY) == b"hi"
    call.cancel()
    await asyncio.wait_for(cancelled.wait(), PROMPTLY)


async def test_a_server_stream_blocked_on_a_full_window_is_cancelled_with_its_client(serve: Serve) -> None:
    """The handler is suspended in a write the client will never make room for: cancelling
    the call, or closing the channel, still ends it."""
    ended: list[asyncio.Event] = []

    async def firehose(request: bytes, context: Context) -> AsyncIterator[bytes]:
        done = asyncio.Event()
        ended.append(done)
        try:
            while True:
                yield b"\x00" * 60_000
        finally:
            done.set()

    running = await serve({"Firehose": grpc.unary_stream_rpc_method_handler(firehose)})
    cancelled_call = running.channel().unary_stream(path("Firehose"))(b"")
    assert len(await asyncio.wait_for(cancelled_call.read(), PROMPTLY)) == 60_000
    await asyncio.sleep(0.2)  # room for the window to fill
    assert not ended[0].is_set()
    cancelled_call.cancel()
    await asyncio.wait_for(ended[0].wait(), PROMPTLY)

    closed_channel = running.channel()
    closed_call = closed_channel.unary_stream(path("Firehose"))(b"")
    assert len(await asyncio.wait_for(closed_call.read(), PROMPTLY)) == 60_000
    await asyncio.sleep(0.2)
    assert not ended[1].is_set()
    await closed_channel.close()
    await asyncio.wait_for(ended[1].wait(), PROMPTLY)


# 7. Many concurrent streams on one connection.


async def test_300_concurrent_server_streams_on_one_channel_all_get_their_first_message(serve: Serve) -> None:
    release = asyncio.Event()
    active = 0
    most = 0

    async def held(request: bytes, context: Context) -> AsyncIterator[bytes]:
        nonlocal active, most
        active += 1
        most = max(most, active)
        try:
            yield b"first " + request
            await release.wait()
            yield b"second " + request
        finally:
            active -= 1

    running = await serve({"Held": grpc.unary_stream_rpc_method_handler(held)})
    channel = running.channel()
    calls = [channel.unary_stream(path("Held"))(b"%d" % i, timeout=30) for i in range(300)]
    firsts = await asyncio.wait_for(asyncio.gather(*(call.read() for call in calls)), 20)
    assert firsts == [b"first %d" % i for i in range(300)]
    # Every handler is still waiting: the 300 calls are open at once (no limit at 100).
    assert most == 300
    release.set()
    seconds = await asyncio.wait_for(asyncio.gather(*(call.read() for call in calls)), 20)
    assert seconds == [b"second %d" % i for i in range(300)]
    codes = await asyncio.wait_for(asyncio.gather(*(call.code() for call in calls)), 20)
    assert set(codes) == {grpc.StatusCode.OK}


# 8. try_write.


async def test_try_write_and_write_interleaved_keep_the_order(serve: Serve) -> None:
    """Bursts of try_write, with a write now and then and a write whenever try_write refuses
    (the window is full): the client gets every message once, in the order they were sent."""
    tried: list[bool] = []
    total = 0

    def message(i: int) -> bytes:
        # Every 50th is larger than a frame (16 KB here): write splits it, and may wait for the
        # window midway; every 7th goes by write alone, the others by try_write first.
        return numbered(i, 40_000 if i % 50 == 0 else 8000)

    async def mixed(request: bytes, context: Context) -> None:
        nonlocal total
        # No await between try_writes: a burst fills the client's window and try_write must
        # refuse. The bound is far past any window grpc's client grants.
        while total < 8000 and (tried.count(False) < 3 or total < 200):
            if total % 7 == 3:
                await context.write(message(total))
            elif total % 50 == 0:
                # Larger than a frame: try_write may only send it if it frames it right.
                if not context.try_write(message(total)):
                    await context.write(message(total))
            else:
                sent = context.try_write(message(total))
                tried.append(sent)
                if not sent:
                    await context.write(message(total))
            total += 1

    running = await serve({"Mixed": grpc.unary_stream_rpc_method_handler(mixed)})
    call = running.channel(options=SMALL_WINDOWS).unary_stream(path("Mixed"))(b"", timeout=30)
    received = await read_all(call, within=30)
    assert [int.from_bytes(m[:4], "big") for m in received] == list(range(total))
    assert received == [message(i) for i in range(total)]
    assert await call.code() == grpc.StatusCode.OK
    # Both paths ran: messages sent by try_write, and messages written after it refused.
    assert tried.count(True) > 3
    assert tried.count(False) >= 3


async def test_try_write_reports_a_full_window_and_sends_nothing_then(serve: Serve) -> None:
    """A client that stops reading a stream: try_write says False once the window is full (and
    sends nothing then), while other streams on the same connection keep getting messages."""
    chunk = 8000
    full = asyncio.Event()
    release = asyncio.Event()
    sent = 0

    async def flood(request: bytes, context: Context) -> None:
        nonlocal sent
        # A bound well past any window the client may grant: never reaching False is a failure.
        while sent < 64 * MB // chunk:
            if not context.try_write(numbered(sent, chunk)):
                full.set()
                break
            sent += 1
            # Let window updates and writes happen, as a publisher between two changes would.
            await asyncio.sleep(0.001 if sent % 16 == 0 else 0)
        await release.wait()
        await context.write(b"after")

    async def ticks(request: bytes, context: Context) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield b"tick %d" % i

    running = await serve(
        {
            "Flood": grpc.unary_stream_rpc_method_handler(flood),
            "Ticks": grpc.unary_stream_rpc_method_handler(ticks),
        }
    )
    channel = running.channel()
    flooded = channel.unary_stream(path("Flood"))(b"", timeout=60)
    await asyncio.wait_for(full.wait(), 20)
    assert 0 < sent < 64 * MB // chunk

    # Other streams, on the same connection and on another one, are not held up.
    other_channel = running.channel(options=[("grpc.use_local_subchannel_pool", 1)])
    for stub_channel in (channel, other_channel):
        tick_call = stub_channel.unary_stream(path("Ticks"))(b"20", timeout=PROMPTLY * 2)
        assert await read_all(tick_call) == [b"tick %d" % i for i in range(20)]

    # Everything try_write said it sent arrives, and nothing of the refused message.
    release.set()
    received = await read_all(flooded, within=20)
    assert received[-1] == b"after"
    assert received[:-1] == [numbered(i, chunk) for i in range(sent)]


# 9. stop(grace).


async def test_stop_lets_a_unary_call_in_progress_finish_within_grace(serve: Serve) -> None:
    started = asyncio.Event()

    async def slowish(request: bytes, context: Context) -> bytes:
        started.set()
        await asyncio.sleep(0.5)
        return b"done " + request

    running = await serve({"Slowish": grpc.unary_unary_rpc_method_handler(slowish)})
    call = running.channel().unary_unary(path("Slowish"))(b"in time", timeout=PROMPTLY * 2)
    await asyncio.wait_for(started.wait(), PROMPTLY)
    began = time.monotonic()
    stopping = asyncio.create_task(running.server.stop(grace=10))
    await asyncio.sleep(0)
    assert await call == b"done in time"
    assert await call.code() == grpc.StatusCode.OK
    await asyncio.wait_for(stopping, PROMPTLY)
    # Stop returns when the calls end, not when the grace runs out.
    assert time.monotonic() - began < 8


async def test_stop_ends_a_stream_still_open_after_grace_with_unavailable(serve: Serve) -> None:
    cancelled = asyncio.Event()
    stopping = False

    async def endless(request: bytes, context: Context) -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"during stop" if stopping else b"before stop"
                await asyncio.sleep(0.02)
        finally:
            cancelled.set()

    running = await serve({"Endless": grpc.unary_stream_rpc_method_handler(endless)})
    call = running.channel().unary_stream(path("Endless"))(b"", timeout=30)
    assert await asyncio.wait_for(call.read(), PROMPTLY) == b"before stop"
    stopping = True
    stop = asyncio.create_task(running.server.stop(grace=1.0))

    async def during_grace() -> None:
        while await call.read() != b"during stop":
            pass

    # The stream goes on during the grace period...
    await asyncio.wait_for(during_grace(), PROMPTLY)
    await asyncio.wait_for(stop, PROMPTLY)
    assert cancelled.is_set()

    # ...and ends UNAVAILABLE after it (once what was sent before is read).
    async def status() -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            while True:
                assert await call.read() == b"during stop"
        code: grpc.StatusCode = raised.value.code()
        return code

    assert await asyncio.wait_for(status(), PROMPTLY) == grpc.StatusCode.UNAVAILABLE


async def test_after_stop_new_calls_fail(serve: Serve) -> None:
    async def echo(request: bytes, context: Context) -> bytes:
        return request

    running = await serve({"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    channel = running.channel()
    stub = channel.unary_unary(path("Echo"))
    assert await stub(b"before", timeout=PROMPTLY) == b"before"
    await asyncio.wait_for(running.server.stop(grace=1), PROMPTLY)
    await asyncio.wait_for(running.server.wait_for_termination(), PROMPTLY)
    assert await code_of(stub(b"after", timeout=2)) == grpc.StatusCode.UNAVAILABLE
    fresh = running.channel().unary_unary(path("Echo"))
    assert await code_of(fresh(b"after", timeout=2)) == grpc.StatusCode.UNAVAILABLE


# 10. grpc's own health and reflection servicers.


async def test_health_check_and_watch(serve: Serve) -> None:
    health_servicer = health.aio.HealthServicer()

    def setup(server: Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    running = await serve({}, setup=setup)
    await health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    stub = health_pb2_grpc.HealthStub(running.channel())

    response = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=PROMPTLY)
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    assert await code_of(stub.Check(health_pb2.HealthCheckRequest(service="no.Such"))) == grpc.StatusCode.NOT_FOUND

    watch = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=30)
    first = await asyncio.wait_for(watch.read(), PROMPTLY)
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    await health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    second = await asyncio.wait_for(watch.read(), PROMPTLY)
    assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()


async def test_reflection_lists_the_services(serve: Serve) -> None:
    names = (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)

    def setup(server: Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(ReflectionServicer(names), server)

    running = await serve({}, setup=setup)
    stub = reflection_pb2_grpc.ServerReflectionStub(running.channel())
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=health.SERVICE_NAME),
    ]
    responses = await read_all(stub.ServerReflectionInfo(iter(requests), timeout=PROMPTLY))
    assert len(responses) == 2
    listed: Any = responses[0]
    assert sorted(service.name for service in listed.list_services_response.service) == sorted(names)
    described: Any = responses[1]
    assert described.file_descriptor_response.file_descriptor_proto


async def test_a_port_in_use_is_refused_not_shared(serve: Serve) -> None:
    """No SO_REUSEPORT: a second server on a taken port is an error, not a silent split of the
    calls between two processes."""
    running = await serve({})
    second = Server()
    with pytest.raises(OSError):
        await second.bind(running.target)
