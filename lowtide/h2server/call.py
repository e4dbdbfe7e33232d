"""One call (an HTTP/2 stream) and the grpc.aio ServicerContext its handler gets."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import h2.exceptions

from lowtide.h2server import wire

if TYPE_CHECKING:
    from lowtide.h2server.server import Connection

_COMPRESS: dict[grpc.Compression, tuple[str, Callable[[bytes], bytes]]] = {
    grpc.Compression.Gzip: ("gzip", gzip.compress),
    grpc.Compression.Deflate: ("deflate", zlib.compress),
}


def peer_common_names(ssl_object: ssl.SSLObject | None) -> list[bytes]:
    """The common names in a client certificate's subject (mutual TLS), as grpc reports them."""
    certificate = ssl_object.getpeercert() if ssl_object is not None else None
    if not certificate:
        return []
    subject: Any = certificate.get("subject", ())
    return [str(value).encode() for rdn in subject for key, value in rdn if key == "commonName"]


class Aborted(grpc.aio.AbortError):  # type: ignore[misc]
    """Raised by `abort`: the handler stops and the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Gone(Exception):
    """The stream is closed (reset by the client, or its connection lost): nothing can be sent."""


class Call:
    """The server's side of one stream: what the client sent, and sending the answer back. A
    message goes into the connection's HTTP/2 buffer at once; the connection writes its buffer to
    the socket once per event-loop turn or every 8 messages, so a change sent to a thousand
    subscribers costs a write per eight of them, not one each."""

    def __init__(
        self,
        connection: Connection,
        stream_id: int,
        method: str,
        metadata: wire.Metadata,
        *,
        encoding: str | None,
        deadline: float | None,
    ) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.method = method
        self.metadata = metadata
        self.deadline = deadline
        self.reader = wire.MessageReader(encoding)
        self.inbox: asyncio.Queue[bytes | wire.WireError | None] = asyncio.Queue()
        self.input_ended = False
        self.headers_sent = False
        self.closed = False
        self.deadline_passed = False
        self.cancelled = False
        self.task: asyncio.Task[None] | None = None
        self.initial_metadata: Sequence[tuple[str, str | bytes]] = ()
        self.compression: tuple[str, Callable[[bytes], bytes]] | None = None
        self._window: asyncio.Future[None] | None = None

    # Inbound, from the connection.

    def received(self, data: bytes) -> None:
        try:
            for message in self.reader.feed(data):
                self.inbox.put_nowait(message)
        except wire.WireError as error:
            self.inbox.put_nowait(error)

    def end_input(self) -> None:
        if not self.input_ended:
            self.input_ended = True
            if self.reader.partial:
                self.inbox.put_nowait(wire.WireError(grpc.StatusCode.INTERNAL, "the request ended inside a message"))
            self.inbox.put_nowait(None)

    def window_opened(self) -> None:
        waiter, self._window = self._window, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def reset(self) -> None:
        """The client reset the stream or went away: the handler is cancelled."""
        self.closed = self.cancelled = True
        self.window_opened()
        if self.task is not None:
            self.task.cancel()

    async def next_message(self) -> bytes | None:
        """The next request message, None at the end of the requests."""
        item = await self.inbox.get()
        if isinstance(item, wire.WireError):
            raise Aborted(item.code, str(item))
        if item is None:
            self.inbox.put_nowait(None)  # every later read sees the end too
        return item

    # Outbound.

    def _send_headers(self) -> None:
        headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
        if self.compression is not None:
            headers.append((b"grpc-encoding", self.compression[0].encode()))
        headers.append((b"grpc-accept-encoding", wire.ACCEPT_ENCODING.encode()))
        self.connection.h2.send_headers(self.stream_id, headers + wire.metadata_headers(self.initial_metadata))
        self.headers_sent = True

    def send_initial_metadata(self) -> None:
        if self.closed:
            raise Gone
        if not self.headers_sent:
            self._send_headers()
            self.connection.cork()

    async def send_message(self, message: bytes) -> None:
        """Puts one message on the stream, waiting only when the client's flow-control window
        (or the socket) is full."""
        if self.closed:
            raise Gone
        if not self.headers_sent:
            self._send_headers()
        if self.compression is None:
            data = wire.frame(message)
        else:
            packed = self.compression[1](message)
            data = wire.PREFIX.pack(True, len(packed)) + packed
        connection = self.connection
        view, sent = memoryview(data), 0
        while sent < len(view):
            if connection.paused:
                await connection.resumed()
            if self.closed:
                raise Gone
            room = min(connection.h2.local_flow_control_window(self.stream_id), connection.h2.max_outbound_frame_size)
            if room <= 0:
                # Let the client have what is sent so far: its window updates follow its reads.
                connection.cork()
                self._window = asyncio.get_running_loop().create_future()
                await self._window
                continue
            chunk = view[sent : sent + room]
            try:
                connection.h2.send_data(self.stream_id, chunk)
            except h2.exceptions.StreamClosedError:
                self.closed = True
                raise Gone from None
            sent += len(chunk)
        connection.cork()

    def try_send(self, message: bytes) -> bool:
        """Sends `message` at once if that needs no waiting (the stream is open and the client's
        window has room), else sends nothing and says so."""
        connection = self.connection
        if self.closed or self.compression is not None or connection.paused:
            return False
        if not self.headers_sent:
            try:
                self._send_headers()
            except h2.exceptions.ProtocolError:
                return False
        return connection.send_now(self.stream_id, wire.frame(message))

    def finish(self, code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, str | bytes]] | None) -> None:
        """Ends the call with its status (trailers, or trailers only when nothing was sent)."""
        if self.closed:
            return
        self.closed = True
        try:
            metadata = wire.metadata_headers(trailing)
        except (UnicodeError, TypeError, AttributeError):
            # Metadata that cannot be a header (a text value outside latin-1, not str or bytes):
            # as grpc's server, the call ends INTERNAL, rather than never.
            code, details, metadata = grpc.StatusCode.INTERNAL, "Invalid metadata", []
        headers = [] if self.headers_sent else [(b":status", b"200"), (b"content-type", b"application/grpc")]
        headers.append((b"grpc-status", str(code.value[0]).encode()))
        if details:
            headers.append((b"grpc-message", wire.escape(details).encode()))
        headers += metadata
        try:
            self.connection.h2.send_headers(self.stream_id, headers, end_stream=True)
        except h2.exceptions.StreamClosedError:
            return
        self.connection.cork()


class Context(grpc.aio.ServicerContext[Any, Any]):  # type: ignore[misc]
    """What a grpc.aio handler expects of its context, for a call on this server."""

    def __init__(
        self,
        call: Call,
        deserialize: Callable[[bytes], Any] | None,
        serialize: Callable[[Any], bytes] | None,
    ) -> None:
        self._call = call
        self._deserialize = deserialize or (lambda data: data)
        self._serialize = serialize or (lambda message: message)
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: Sequence[tuple[str, str | bytes]] = ()
        self._callbacks: list[Callable[[Any], None]] = []
        self._done = False

    async def read(self) -> Any:
        message = await self._call.next_message()
        return grpc.aio.EOF if message is None else self._deserialize(message)

    async def write(self, message: Any) -> None:
        await self._call.send_message(self._serialize(message))

    def try_write(self, message: Any) -> bool:
        """Sends `message` now if it can go without waiting, else nothing (then `write` it).
        For a publisher that pushes one message to many streams from one task: no task switch
        per stream, and a stream whose client reads slowly is left to its own handler."""
        return self.try_write_serialized(self._serialize(message))

    def try_write_serialized(self, data: bytes) -> bool:
        """`try_write` of a message serialized already: one message pushed to many streams is
        serialized once, not once per stream."""
        return self._call.try_send(data)

    async def send_initial_metadata(self, initial_metadata: Sequence[tuple[str, str | bytes]]) -> None:
        if self._call.headers_sent:
            raise ValueError("initial metadata was already sent")
        self._call.initial_metadata = tuple(initial_metadata)
        self._call.send_initial_metadata()

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, str | bytes]] = ()
    ) -> NoReturn:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort with OK: a call ends with OK by returning")
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise Aborted(code, details)

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._trailing = tuple(trailing_metadata)

    def trailing_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._trailing

    def invocation_metadata(self) -> wire.Metadata:
        return self._call.metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code or grpc.StatusCode.OK

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details

    def set_compression(self, compression: grpc.Compression) -> None:
        if self._call.headers_sent:
            raise RuntimeError("set_compression after the first message or the initial metadata")
        self._call.compression = _COMPRESS.get(compression)

    def disable_next_message_compression(self) -> None:
        # One message uncompressed among compressed ones: simplest to send the whole call so.
        if not self._call.headers_sent:
            self._call.compression = None

    def peer(self) -> str:
        return self._call.connection.peer

    def peer_identities(self) -> Iterable[bytes] | None:
        names = peer_common_names(self._call.connection.ssl_object)
        return names or None

    def peer_identity_key(self) -> str | None:
        return "x509_common_name" if self.peer_identities() else None

    def auth_context(self) -> Mapping[str, Iterable[bytes]]:
        ssl_object: ssl.SSLObject | None = self._call.connection.ssl_object
        if ssl_object is None:
            return {}
        context: dict[str, Iterable[bytes]] = {"transport_security_type": [b"ssl"]}
        names = peer_common_names(ssl_object)
        if names:
            context["x509_common_name"] = names
        return context

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def cancelled(self) -> bool:
        return self._call.cancelled

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def ended(self) -> None:
        """Called by the server when the call is over."""
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    @property
    def status(self) -> tuple[grpc.StatusCode, str, Sequence[tuple[str, str | bytes]]]:
        """How the call ends when its handler returns: OK unless set_code said otherwise."""
        return self._code or grpc.StatusCode.OK, self._details, self._trailing

    def serialize(self, message: Any) -> bytes:
        return self._serialize(message)

    def deserialize(self, data: bytes) -> Any:
        try:
            return self._deserialize(data)
        except Exception as error:
            raise Aborted(grpc.StatusCode.INTERNAL, f"cannot decode the request: {error}") from None
