"""The server: listeners, one HTTP/2 connection per client (the `h2` state machine), and each
call run as a task through the grpc.aio interceptors and method handlers it was given."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from lowtide.h2server import wire
from lowtide.h2server.call import Aborted, Call, Context, Gone

log = logging.getLogger("lowtide.grpc")

_MAX_STREAMS = 2**31 - 1  # as grpc's own server: no limit on concurrent calls per connection
_WINDOW = 1 << 20  # what each client may send before we acknowledge it
# Messages after which a connection writes without waiting for the end of the event-loop turn.
_FLUSH_EVERY = 8
# An HTTP/2 frame header of a DATA frame with no flags: 24-bit length, type 0, flags, stream id.
_DATA_HEADER = struct.Struct(">BHBBL")


class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    def __init__(self, method: str, invocation_metadata: wire.Metadata) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class Connection(asyncio.Protocol):
    """One client connection. Every message sent in an event-loop turn leaves in one socket write
    at the end of the turn (`cork`)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
            },
        )
        self.calls: dict[int, Call] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.ssl_object: ssl.SSLObject | None = None
        self.paused = False
        self._resumed: asyncio.Future[None] | None = None
        self._corked = False
        self._unflushed = 0
        self._out = bytearray()  # DATA frames of `send_now`, after what h2 had before them
        self._going_away = False
        self._loop = asyncio.get_running_loop()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.ssl_object = transport.get_extra_info("ssl_object")
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple) and len(address) >= 2:
            host, port = address[0], address[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        if self.ssl_object is not None and self.ssl_object.selected_alpn_protocol() not in (None, "h2"):
            transport.close()
            return
        self.server.connections.add(self)
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(_WINDOW)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server.connections.discard(self)
        for call in list(self.calls.values()):
            call.reset()
        self.calls.clear()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        waiter, self._resumed = self._resumed, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def resumed(self) -> None:
        if self._resumed is None:
            self._resumed = self._loop.create_future()
        await self._resumed

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as error:
            log.info("grpc.protocol_error", extra={"peer": self.peer, "error": str(error)})
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            try:
                self._handle(event)
            except h2.exceptions.ProtocolError as error:
                # One stream's trouble (an answer to a stream the client has just reset): the
                # other streams' events are still handled.
                log.info("grpc.stream_error", extra={"peer": self.peer, "error": str(error)})
        self.flush()

    # HTTP/2 events

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event.stream_id, event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = self.calls.get(event.stream_id)
            if call is not None and event.data:
                call.received(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.end_input()
        elif isinstance(event, h2.events.StreamReset):
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                call.reset()
        elif isinstance(event, h2.events.WindowUpdated):
            if event.stream_id:
                call = self.calls.get(event.stream_id)
                if call is not None:
                    call.window_opened()
            else:
                self._all_windows_opened()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._all_windows_opened()
        elif isinstance(event, h2.events.ConnectionTerminated) and self.transport is not None:
            self.transport.close()

    def _all_windows_opened(self) -> None:
        for call in self.calls.values():
            call.window_opened()

    def _request(self, stream_id: int, raw: Sequence[tuple[bytes, bytes]]) -> None:
        headers = {bytes(name): bytes(value) for name, value in raw}
        if headers.get(b":method") != b"POST":
            self.h2.send_headers(stream_id, [(b":status", b"405")], end_stream=True)
            return
        if not headers.get(b"content-type", b"").startswith(b"application/grpc"):
            self.h2.send_headers(stream_id, [(b":status", b"415")], end_stream=True)
            return
        if self._going_away:
            # After our GOAWAY: the client may retry it on another connection.
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        method = headers.get(b":path", b"").decode("latin-1")
        encoding = headers.get(b"grpc-encoding", b"identity").decode("latin-1")
        call = Call(self, stream_id, method, (), encoding=None if encoding == "identity" else encoding, deadline=None)
        self.calls[stream_id] = call
        try:
            call.metadata = wire.metadata(raw)
            timeout = headers.get(b"grpc-timeout")
            if timeout is not None:
                call.deadline = time.monotonic() + wire.timeout(timeout.decode("latin-1"))
        except (wire.WireError, ValueError) as error:
            code = error.code if isinstance(error, wire.WireError) else grpc.StatusCode.INTERNAL
            call.finish(code, f"bad request headers: {error}", None)
            del self.calls[stream_id]
            return
        call.task = self._loop.create_task(self.server.run(call))

    # Writing

    def cork(self) -> None:
        """Writes what HTTP/2 has to send at the end of this event-loop turn, or now when many
        messages are waiting: the client starts reading the first of a large fan-out while the
        rest are still being put together."""
        self._unflushed += 1
        if self._unflushed >= _FLUSH_EVERY:
            self.flush()
        elif not self._corked:
            self._corked = True
            self._loop.call_soon(self._flush_corked)

    def _flush_corked(self) -> None:
        self._corked = False
        self.flush()

    def flush(self) -> None:
        self._unflushed = 0
        data = self.h2.data_to_send()
        if self._out:
            data = bytes(self._out) + data
            self._out.clear()
        if data and self.transport is not None:
            self.transport.write(data)

    def send_now(self, stream_id: int, data: bytes) -> bool:
        """Puts `data` on the stream as one DATA frame if the stream is open and the windows have
        room, else does nothing and says so. The frame is built here and the windows counted
        down as h2's `send_data` does (same attributes, so h2's window updates stay right):
        h2's own way builds frame objects and costs three times as much, which adds up in a
        fan-out to a thousand streams. Only for calls that have not ended their side."""
        protocol = self.h2
        stream = protocol.streams.get(stream_id)
        size = len(data)
        if (
            stream is None
            or not stream.open
            or size > protocol.max_outbound_frame_size
            or size > protocol.outbound_flow_control_window
            or size > stream.outbound_flow_control_window
        ):
            return False
        pending = protocol.data_to_send()
        if pending:
            self._out += pending
        self._out += _DATA_HEADER.pack(size >> 16, size & 0xFFFF, 0, 0, stream_id)
        self._out += data
        stream.outbound_flow_control_window -= size
        protocol.outbound_flow_control_window -= size
        self.cork()
        return True

    def ended(self, call: Call) -> None:
        if self.calls.get(call.stream_id) is call:
            del self.calls[call.stream_id]

    def go_away(self) -> None:
        """Tells the client to start no more calls here; those started go on. (A GOAWAY frame of
        our own: h2's would refuse to send on the open streams after it.)"""
        if self._going_away or self.transport is None:
            return
        self._going_away = True
        self.flush()
        frame = GoAwayFrame(stream_id=0)
        frame.last_stream_id = self.h2.highest_inbound_stream_id
        self.transport.write(frame.serialize())

    def close(self) -> None:
        if self.transport is None:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.close_connection()
        self.flush()
        self.transport.close()


Handler: TypeAlias = grpc.RpcMethodHandler
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]


class Server:
    """A gRPC server on asyncio and h2 that takes grpc.aio's servicers and interceptors as they
    are (`add_XServicer_to_server(servicer, server)` works), unary and streaming alike.

    Why not grpc.aio's own server: there every streamed message costs a completion-queue round
    trip through a poller thread (a socket write, a wake-up and a read per message) and a
    `sendmsg` of its own: a change streamed to 1,000 subscribers took 75 ms of CPU however few
    their connections. Here messages go into each connection's HTTP/2 buffer and each connection
    writes once per event-loop turn (or every few messages), and a publisher can push to idle
    streams with `Context.try_write`, without a task switch each: about 19 ms for the same."""

    def __init__(self, *, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        self._interceptors = tuple(interceptors)
        self._handlers: dict[str, Handler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self._listeners: list[asyncio.Server] = []
        self.connections: set[Connection] = set()
        self._stopping = False
        self._terminated = asyncio.Event()

    # Registration, as grpc.aio.Server's

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict[str, Handler]) -> None:
        for name, handler in method_handlers.items():
            self._handlers[f"/{service_name}/{name}"] = handler

    async def bind(self, address: str, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listens on `host:port` (port 0: any free port), with TLS when given a context; returns
        the port. OSError when the address cannot be bound (in use, or not an address here)."""
        name, _, port_text = address.rpartition(":")
        host: str | None = name.strip("[]") or None
        if host in ("0.0.0.0", "::"):  # every address, IPv4 and IPv6 alike, as grpc does
            host = None
        port = int(port_text)
        loop = asyncio.get_running_loop()
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        bound = port
        listeners: list[asyncio.Server] = []
        try:
            for family, *_, sockaddr in {(info[0], info[4][0]): info for info in infos}.values():
                listener = await loop.create_server(
                    lambda: Connection(self),
                    str(sockaddr[0]),
                    bound,
                    family=family,
                    ssl=ssl_context,
                    reuse_address=True,
                    start_serving=False,
                )
                # Port 0 on several addresses: every one takes the port the first was given.
                bound = listener.sockets[0].getsockname()[1]
                listeners.append(listener)
        except OSError:
            for listener in listeners:
                listener.close()
            raise
        self._listeners += listeners
        return bound

    async def start(self) -> None:
        for listener in self._listeners:
            await listener.start_serving()

    async def stop(self, grace: float | None) -> None:
        """Refuses new calls (GOAWAY), gives those running `grace` seconds, then cancels them
        (UNAVAILABLE) and closes every connection."""
        self._stopping = True
        for listener in self._listeners:
            listener.close()
        for connection in list(self.connections):
            connection.go_away()
        tasks = [call.task for c in self.connections for call in c.calls.values() if call.task is not None]
        if tasks and grace:
            await asyncio.wait(tasks, timeout=grace)
        running = [task for task in tasks if not task.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for connection in list(self.connections):
            connection.close()
        self._terminated.set()

    async def wait_for_termination(self) -> None:
        await self._terminated.wait()

    # Calls

    async def _handler(self, details: _CallDetails) -> Handler | None:
        async def lookup(call_details: grpc.HandlerCallDetails) -> Handler | None:
            handler = self._handlers.get(call_details.method)
            if handler is None:
                for generic in self._generic:
                    handler = generic.service(call_details)
                    if handler is not None:
                        break
            return handler

        continuation: Continuation = lookup
        for interceptor in reversed(self._interceptors):
            continuation = _chain(interceptor, continuation)
        return await continuation(details)

    async def run(self, call: Call) -> None:
        """Runs one call to its end and sends its status."""
        context: Context | None = None
        code, details, trailing = grpc.StatusCode.OK, "", None
        deadline = None
        if call.deadline is not None:
            deadline = asyncio.get_running_loop().call_at(
                asyncio.get_running_loop().time() + max(0.0, call.deadline - time.monotonic()), _expire, call
            )
        try:
            handler = await self._handler(_CallDetails(call.method, call.metadata))
            if handler is None:
                code, details = grpc.StatusCode.UNIMPLEMENTED, "Method not found!"
            else:
                context = Context(call, handler.request_deserializer, handler.response_serializer)
                await _invoke(handler, call, context)
                code, details, trailing = context.status
        except Aborted as aborted:
            code, details = aborted.code, aborted.details
            trailing = context.trailing_metadata() if context is not None else None
        except Gone:
            pass
        except asyncio.CancelledError:
            if call.deadline_passed:
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
            elif not call.cancelled:
                code, details = grpc.StatusCode.UNAVAILABLE, "the server is stopping"
        except Exception as error:
            log.exception("grpc.handler_failed", extra={"method": call.method})
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(error).__name__}: {error}"
            if context is not None:
                # As grpc.aio: a code the handler set before raising is the call's (the generated
                # base servicers set UNIMPLEMENTED and raise NotImplementedError), with its trailers.
                if context.code() != grpc.StatusCode.OK:
                    code = context.code()
                trailing = context.trailing_metadata()
        finally:
            if deadline is not None:
                deadline.cancel()
            if not call.cancelled:
                call.finish(code, details, trailing)
            call.connection.ended(call)
            if context is not None:
                context.ended()


def _chain(interceptor: grpc.aio.ServerInterceptor, continuation: Continuation) -> Continuation:
    async def intercepted(details: grpc.HandlerCallDetails) -> Handler | None:
        handler: Handler | None = await interceptor.intercept_service(continuation, details)
        return handler

    return intercepted


def _expire(call: Call) -> None:
    call.deadline_passed = True
    if call.task is not None:
        call.task.cancel()


async def _requests(call: Call, context: Context) -> AsyncIterator[Any]:
    while (message := await call.next_message()) is not None:
        yield context.deserialize(message)


async def _one_request(call: Call, context: Context) -> Any:
    message = await call.next_message()
    if message is None:
        raise Aborted(grpc.StatusCode.INTERNAL, "no request message")
    if await call.next_message() is not None:
        raise Aborted(grpc.StatusCode.INTERNAL, "more than one request message for a unary request")
    return context.deserialize(message)


async def _invoke(handler: Handler, call: Call, context: Context) -> None:
    """Calls the behaviour the handler has, as grpc.aio does: a response to send, an async
    iterator of responses, or a coroutine that writes through `context.write`."""
    if handler.request_streaming:
        request: Any = _requests(call, context)
        behaviour = handler.stream_stream if handler.response_streaming else handler.stream_unary
    else:
        request = await _one_request(call, context)
        behaviour = handler.unary_stream if handler.response_streaming else handler.unary_unary
    result = behaviour(request, context)
    if not handler.response_streaming:
        response = await result if inspect.isawaitable(result) else result
        # As grpc.aio: after set_code with a non-OK code the response (often None) is dropped.
        if context.code() == grpc.StatusCode.OK:
            await call.send_message(context.serialize(response))
        return
    if hasattr(result, "__aiter__"):
        async for response in result:
            await call.send_message(context.serialize(response))
    elif inspect.isawaitable(result):
        await result
