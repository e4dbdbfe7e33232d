"""The one place where lowtide's exceptions become gRPC statuses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from lowtide import errors

_CODES: dict[type[errors.LowtideError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.TooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.DatabaseUnavailable: grpc.StatusCode.UNAVAILABLE,
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
