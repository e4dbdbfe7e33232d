"""The channel every client opens: plaintext, or TLS (``ca``, and ``cert``/``key`` for mutual
TLS, or a ready ``credentials`` object), with an optional bearer ``token`` sent as
``authorization: Bearer <token>`` on every call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

__all__ = ["KEEPALIVE_TIMEOUT_MS", "KEEPALIVE_TIME_MS", "Security", "keepalive_options", "open_channel"]

# Every channel pings its server every 30 s while a call is open and gives up on the connection
# when no answer comes within 10 s: a stream whose server is gone without a word (a half-open
# connection, a frozen process) then fails UNAVAILABLE and the caller reconnects, instead of
# waiting for ever. lowtide's services permit a ping every 10 s on a silent connection.
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000


def keepalive_options(
    time_ms: int = KEEPALIVE_TIME_MS, timeout_ms: int = KEEPALIVE_TIMEOUT_MS
) -> list[tuple[str, int]]:
    """The keepalive options every channel gets (``Security(options=...)`` may override each)."""
    return [
        ("grpc.keepalive_time_ms", time_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        # What grpc core (1.85) times a keepalive ping by: without it an unanswered ping waits a minute.
        ("grpc.http2.ping_timeout_ms", timeout_ms),
        # Pings only while a call is open (an idle channel is left alone), and keeps pinging a
        # silent stream: grpc's default stops after two pings with no data in between.
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]


class Security:
    """How to reach a service: ``token`` for its roles, ``ca``/``cert``/``key`` (file paths or PEM
    bytes) or ``credentials`` for TLS. The default is plaintext without a token."""

    def __init__(
        self,
        *,
        token: str | None = None,
        ca: str | bytes | None = None,
        cert: str | bytes | None = None,
        key: str | bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if (cert is None) != (key is None):
            raise ValueError("cert and key go together: pass both for mutual TLS, or neither")
        if credentials is not None and (ca or cert or key):
            raise ValueError("pass credentials, or ca/cert/key, not both")
        self.token = token or None
        self._ca, self._cert, self._key = ca, cert, key
        self._credentials = credentials
        self.options = tuple(options)

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self._credentials is not None:
            return self._credentials
        if self._ca is None and self._cert is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self._ca),
            private_key=_pem(self._key),
            certificate_chain=_pem(self._cert),
        )


def _pem(value: str | bytes | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).expanduser().read_bytes()


def _with_token(details: Any, token: str) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add("authorization", f"Bearer {token}")
    return details._replace(metadata=metadata)


# Interceptors rather than call credentials, because call credentials are only sent over TLS and
# a token on a loopback plaintext channel is a legitimate setup. One class per call shape: a
# grpc.aio channel files each interceptor under the first shape it matches only.
class _UnaryUnaryToken(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)


class _UnaryStreamToken(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)


class _StreamUnaryToken(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)


class _StreamStreamToken(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)


def open_channel(target: str, security: Security | None = None) -> grpc.aio.Channel:
    """A channel to `target` (call inside the running event loop, as grpc.aio requires), with
    keepalive pings (see ``keepalive_options``)."""
    security = security or Security()
    token = security.token
    interceptors: list[Any] | None = None
    if token:
        interceptors = [
            cls(token) for cls in (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)
        ]
    given = {name for name, _ in security.options}
    options = [*(o for o in keepalive_options() if o[0] not in given), *security.options]
    credentials = security.credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)
