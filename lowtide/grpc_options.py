"""The limits both services give grpc, in one place (the README's Security section lists them).

Every connection to a lowtide service is long-lived: a worker's `Connect` stream and a subscriber's
`Subscribe` stream stay open for hours and may be silent for most of that time. The limits below
are chosen for that: keepalive pings find a connection whose peer is gone (a half-open TCP
connection never fails on its own); clients may ping that often without being called abusive;
and what a client may send (streams, message and metadata sizes, pings) is bounded. The clients'
own keepalive (every 30 s, 10 s to answer) is `lowtide_proto.channel.open_channel`, which the CLI and
the scheduler's Subscribe stream use too.

Max connection age: the signal service ends a connection after an hour (with a minute's grace),
so subscribers spread again over the replicas behind a load balancer, one added later included;
a subscriber resubscribes and is sent the current state first, so it loses nothing (the
scheduler and `lowtide signal watch` do). The scheduler leaves the age unlimited: a worker's
stream holds its running attempts, and ending it on a timer would lose work for no gain.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "SIGNAL_MAX_CONCURRENT_STREAMS",
    "SIGNAL_MAX_RECEIVE_BYTES",
    "SIGNAL_MAX_SEND_BYTES",
    "server_options",
    "signal_server_options",
]

Option = tuple[str, int]

# Servers ping a connection silent for a minute and close it when no answer comes in 20 s.
SERVER_KEEPALIVE_TIME_MS: Final = 60_000
SERVER_KEEPALIVE_TIMEOUT_MS: Final = 20_000
# A client may ping every 10 s even when the server has sent nothing (a silent Subscribe or
# Connect stream); a ping sooner is a strike, and after MAX_PING_STRIKES the server ends the
# connection (GOAWAY "too_many_pings"). A PING flood costs a connection, not the service.
MIN_PING_INTERVAL_WITHOUT_DATA_MS: Final = 10_000
MAX_PING_STRIKES: Final = 2
# A connection with no call open for 5 minutes is closed (the client reconnects when it needs to).
MAX_CONNECTION_IDLE_MS: Final = 5 * 60_000
# grpc's "no limit" for the age (a signed 32-bit int of milliseconds).
UNLIMITED_MS: Final = 2**31 - 1
SIGNAL_MAX_CONNECTION_AGE_MS: Final = 60 * 60_000
SIGNAL_MAX_CONNECTION_AGE_GRACE_MS: Final = 60_000
# Request and response metadata (headers) together: a bearer token and a trace context fit many
# times; larger headers are refused with RESOURCE_EXHAUSTED before a handler runs.
MAX_METADATA_BYTES: Final = 16 * 1024
# What the signal service receives is small (a SetSignal, a Subscribe or GetHistory request, a
# reflection query: well under a kilobyte), and grpc reads a request up to its announced size
# before any handler runs: 64 KiB bounds what a client can make it hold per stream. What it sends
# may be larger (a forecast of a few hundred points; up to 10,000 points in a GetHistory answer,
# about 200 KB).
SIGNAL_MAX_RECEIVE_BYTES: Final = 64 * 1024
SIGNAL_MAX_SEND_BYTES: Final = 4 * 1024 * 1024
# Streams one connection may have open at once; further calls of that client wait for its own.
SIGNAL_MAX_CONCURRENT_STREAMS: Final = 1_000


def server_options(
    *,
    max_concurrent_streams: int,
    max_message_bytes: int,
    max_send_bytes: int | None = None,
    max_connection_age_ms: int = UNLIMITED_MS,
    max_connection_age_grace_ms: int = UNLIMITED_MS,
) -> list[Option]:
    """The options a lowtide grpc.aio server is built with; `max_send_bytes` defaults to
    `max_message_bytes`."""
    return [
        # No SO_REUSEPORT: a second service on the same port is an error, not a silent split of
        # the connections between two processes.
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", max_concurrent_streams),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes if max_send_bytes is None else max_send_bytes),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.keepalive_time_ms", SERVER_KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
        # What grpc core (1.85) times a keepalive ping by: without it an unanswered ping waits a minute.
        ("grpc.http2.ping_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
        # Keep pinging a silent stream: grpc's default stops after two pings without data.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_WITHOUT_DATA_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
        ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
        ("grpc.max_connection_age_ms", max_connection_age_ms),
        ("grpc.max_connection_age_grace_ms", max_connection_age_grace_ms),
    ]


def signal_server_options() -> list[Option]:
    return server_options(
        max_concurrent_streams=SIGNAL_MAX_CONCURRENT_STREAMS,
        max_message_bytes=SIGNAL_MAX_RECEIVE_BYTES,
        max_send_bytes=SIGNAL_MAX_SEND_BYTES,
        max_connection_age_ms=SIGNAL_MAX_CONNECTION_AGE_MS,
        max_connection_age_grace_ms=SIGNAL_MAX_CONNECTION_AGE_GRACE_MS,
    )
