"""The one place where lowtide's exceptions become gRPC statuses."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from lowtide import errors

_CODES: dict[type[errors.LowtideError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.TooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.TooFast: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.DatabaseUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}


def status_for(error: errors.LowtideError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        code = _CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: errors.LowtideError) -> NoReturn:
    if error.trailing:
        context.set_trailing_metadata(error.trailing)
    await context.abort(status_for(error), str(error))
    raise AssertionError("context.abort returned")  # pragma: no cover


R = TypeVar("R")


def handles_errors(
    method: Callable[[Any, Any, Any], Awaitable[R]],
) -> Callable[[Any, Any, Any], Awaitable[R]]:
    """Decorates a unary servicer method so a LowtideError leaves it as its gRPC status."""

    async def wrapper(self: Any, request: Any, context: Any) -> R:
        try:
            return await method(self, request, context)
        except errors.LowtideError as error:
            await abort(context, error)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


class _Undecodable:
    """What a request that is no valid message decodes to, so that the handler can refuse it."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:  # DecodeError, or invalid UTF-8 in a string field
            return _Undecodable(error)

    return decode


class RefuseUndecodable(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """grpc.aio answers a request its deserializer cannot parse with UNKNOWN; this interceptor
    answers INVALID_ARGUMENT instead, which a caller can act on. On a stream of requests
    (WorkerService.Connect, written with context.write) the undecodable message raises
    InvalidArgument where the handler reads it, and the handler turns that into its status."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        if handler.request_streaming:
            return _checked_stream(handler, method)
        inner = handler.unary_stream if handler.response_streaming else handler.unary_unary

        async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"request is not a valid {method} message: {request.error}"
            )

        if handler.response_streaming and inspect.isasyncgenfunction(inner):

            async def yielding(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                if isinstance(request, _Undecodable):
                    await refuse(request, context)
                async for item in inner(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                yielding, _tolerant(handler.request_deserializer), handler.response_serializer
            )

        # A unary response, or a stream written with context.write (health's Watch): awaited.
        async def awaited(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            return await inner(request, context)

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                awaited, _tolerant(handler.request_deserializer), handler.response_serializer
            )

        return grpc.unary_unary_rpc_method_handler(
            awaited, _tolerant(handler.request_deserializer), handler.response_serializer
        )


def _checked_stream(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """A bidirectional handler awaited as a coroutine, with its requests checked as they are read."""
    inner = handler.stream_stream
    if not handler.response_streaming or inner is None or inspect.isasyncgenfunction(inner):
        return handler

    async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, _Undecodable):
                raise errors.InvalidArgument("request", f"not a valid {method} message ({request.error})")
            yield request

    async def streamed(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await inner(checked(requests), context)

    return grpc.stream_stream_rpc_method_handler(
        streamed, _tolerant(handler.request_deserializer), handler.response_serializer
    )
