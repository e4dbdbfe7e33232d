"""The channel every client opens: plaintext, or TLS (``ca``, and ``cert``/``key`` for mutual
TLS, or a ready ``credentials`` object), with an optional bearer ``token`` sent as
``authorization: Bearer <token>`` on every call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

__all__ = ["Security", "open_channel"]


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
    """A channel to `target` (call inside the running event loop, as grpc.aio requires)."""
    security = security or Security()
    token = security.token
    interceptors: list[Any] | None = None
    if token:
        interceptors = [
            cls(token) for cls in (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)
        ]
    credentials = security.credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=security.options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, credentials, options=security.options, interceptors=interceptors)
