"""Token authentication for both services: a grpc.aio server interceptor that reads
`authorization: Bearer <token>` from the call's metadata, finds the token by its SHA-256 among
`[auth] tokens`, and lets the call through only when the token's role may call the method.

No valid token: UNAUTHENTICATED. A valid token whose role may not call the method:
PERMISSION_DENIED. Health checking, reflection and the KEDA scaler stay open (they reveal no
task or signal contents, and their callers, load balancers, grpcurl and KEDA, carry no token).
A method of a protected service missing from the tables needs `admin`: a new RPC is closed
until someone decides who may call it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from lowtide.config import AuthConfig, Config, TokenEntry
from lowtide.errors import ConfigError

log = logging.getLogger("lowtide.auth")

WORKER = "worker"
SUBMITTER = "submitter"
ADMIN = "admin"
# Reads everything a person looks at (tasks, status, schedules, signals) and changes nothing:
# the role of the web console's read-only users.
VIEWER = "viewer"

# Who may call what, one table per service; admin may call everything.
SCHEDULER_METHODS: Mapping[str, frozenset[str]] = {
    **{
        f"/lowtide.v1.SchedulerService/{name}": frozenset({SUBMITTER, ADMIN})
        for name in ("SubmitTask", "SubmitStream", "SubmitTasks", "CancelTask", "RetryTask")
    },
    **{
        f"/lowtide.v1.SchedulerService/{name}": frozenset({SUBMITTER, VIEWER, ADMIN})
        for name in ("GetTask", "ListTasks", "WaitTask", "ExplainTask")
    },
    **{f"/lowtide.v1.SchedulerService/{name}": frozenset({VIEWER, ADMIN}) for name in ("GetStatus", "ListSchedules")},
}
WORKER_METHODS: Mapping[str, frozenset[str]] = {"/lowtide.v1.WorkerService/Connect": frozenset({WORKER, ADMIN})}
# Every role may read signals (workers check cost holds, submitters plan around them); only an
# admin may set one.
SIGNAL_METHODS: Mapping[str, frozenset[str]] = {
    **{
        f"/lowtide.v1.SignalService/{name}": frozenset({WORKER, SUBMITTER, VIEWER, ADMIN})
        for name in ("GetSignal", "Subscribe", "ListSignals", "GetHistory", "GetForecast")
    },
    "/lowtide.v1.SignalService/SetSignal": frozenset({ADMIN}),
}

# Services any caller may use, token or not.
OPEN_SERVICES = frozenset({health.SERVICE_NAME, reflection.SERVICE_NAME, "externalscaler.ExternalScaler"})


def hash_token(token: str) -> str:
    """What `[auth] tokens` stores for a token: its SHA-256, hex. Tokens are random secrets, not
    passwords, so a plain (unsalted, fast) hash is enough to keep the config from leaking them."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Denial:
    code: grpc.StatusCode
    message: str


def is_loopback(listen: str) -> bool:
    """Whether `host:port` listens on loopback only (an empty host or 0.0.0.0/[::] does not)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(config: AuthConfig, listen: str, section: str) -> None:
    """Refuses to serve without auth beyond loopback unless `[auth] allow_insecure_remote`."""
    if not config.enabled and not config.allow_insecure_remote and not is_loopback(listen):
        raise ConfigError(
            f"[{section}] listen: {listen} is not a loopback address and auth is off (LOWTIDE_AUTH=off); "
            "anyone who can reach it could submit tasks and set signals. Turn auth on with [auth] tokens, "
            "listen on 127.0.0.1, or set [auth] allow_insecure_remote = true to accept that"
        )


class TokenAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The interceptor; `methods` is the method -> roles table of the service(s) it guards."""

    def __init__(self, tokens: tuple[TokenEntry, ...], methods: Mapping[str, frozenset[str]]) -> None:
        self._tokens = tokens
        self._methods = dict(methods)

    def verdict(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> Denial | None:
        service = method.lstrip("/").split("/", 1)[0]
        if service in OPEN_SERVICES:
            return None
        token = _bearer(metadata)
        if token is None:
            return Denial(grpc.StatusCode.UNAUTHENTICATED, "no token: send metadata authorization: Bearer <token>")
        entry = self._match(token)
        if entry is None:
            return Denial(grpc.StatusCode.UNAUTHENTICATED, "token not accepted")
        allowed = self._methods.get(method, frozenset({ADMIN}))
        if entry.role not in allowed:
            return Denial(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {entry.name!r} has role {entry.role}; {method} needs {' or '.join(sorted(allowed))}",
            )
        return None

    def _match(self, token: str) -> TokenEntry | None:
        digest = hash_token(token)
        found = None
        # Every entry is compared, in constant time, so timing tells nothing about which matched.
        for entry in self._tokens:
            if hmac.compare_digest(entry.sha256, digest):
                found = entry
        return found

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        denial = self.verdict(details.method, tuple(details.invocation_metadata or ()))
        handler = await continuation(details)
        if denial is None or handler is None:
            return handler
        # The token itself is never logged: only the method and why it was refused.
        log.info("auth.denied", extra={"method": details.method, "code": denial.code.name})
        return _refusing(handler, denial)


def _bearer(metadata: tuple[tuple[str, str | bytes], ...]) -> str | None:
    for key, value in metadata:
        if key.lower() == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _refusing(handler: grpc.RpcMethodHandler, denial: Denial) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only refuses the call."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(denial.code, denial.message)

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **serializers)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **serializers)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **serializers)
    return grpc.unary_unary_rpc_method_handler(refuse, **serializers)


def interceptors(config: Config, methods: Mapping[str, frozenset[str]]) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors a service is built with: none when auth is off."""
    if not config.auth.enabled:
        return []
    if not config.auth.tokens:
        # A service that refuses every call looks broken rather than locked: say so at start.
        raise ConfigError(
            "auth is on and [auth] tokens is empty, so every call would be refused: add tokens "
            "(`lowtide token hash` prints the sha256 to store), or set LOWTIDE_AUTH=off for a loopback dev setup"
        )
    return [TokenAuth(config.auth.tokens, methods)]


def caller(config: AuthConfig, metadata: Iterable[tuple[str, str | bytes]]) -> TokenEntry | None:
    """The token entry a call was made with (the interceptor has already let it in); None when
    auth is off. Servicers use it to record who submitted a task and to let a submitter cancel
    only its own."""
    if not config.enabled:
        return None
    token = _bearer(tuple(metadata))
    if token is None:
        return None
    digest = hash_token(token)
    found = None
    for entry in config.tokens:
        if hmac.compare_digest(entry.sha256, digest):
            found = entry
    return found
