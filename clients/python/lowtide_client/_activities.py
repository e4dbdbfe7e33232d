"""Registered activities and how one attempt's outcome becomes a ``TaskResult``.

Kept apart from the stream handling in ``_worker`` so that the rules for user code (sync vs
async, what a return value may be, how an exception is reported) sit in one small place.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from lowtide_client import _codec
from lowtide_client._errors import NonRetryableError
from lowtide_proto.lowtide.v1 import task_pb2, worker_pb2

__all__ = [
    "Activity",
    "ActivityFunction",
    "ActivityResult",
    "UnknownActivityType",
    "failure_result",
    "invoke",
    "make_activity",
    "success_result",
]

ActivityResult = bytes | str | None
#: ``fn(payload) -> bytes | str | None``, either a plain function or a coroutine function; or a
#: typed one, ``fn(params: Params) -> Result`` (a dataclass, a pydantic model or JSON types),
#: whose payload is decoded and whose return value is encoded as JSON (``_codec``).
ActivityFunction = Callable[[Any], object]


class UnknownActivityType(Exception):
    """An assignment named an activity type this worker did not register.

    The scheduler only assigns registered types, so this means a mismatch (for example a
    worker restarted with fewer activities). It is reported as a retryable failure: another
    worker may well have the activity.
    """


@dataclass(frozen=True, slots=True)
class Activity:
    name: str
    fn: ActivityFunction
    local: bool
    is_async: bool
    #: Typed: the first parameter is annotated with something other than ``bytes``; the
    #: payload is decoded for it and the return value encoded (``_codec``).
    typed: bool = False
    parameter: Any = Any


def make_activity(name: str, fn: ActivityFunction, *, local: bool) -> Activity:
    if not isinstance(name, str) or not name:
        raise ValueError("an activity needs a non-empty name")
    if not callable(fn):
        raise TypeError(f"activity {name!r} must be callable, not {type(fn).__name__}")
    # Callable objects with an ``async def __call__`` count as coroutine functions too.
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - looking for async __call__, not callability
    )
    parameter, _ = _codec.hints(fn)
    typed = not _codec.is_raw(parameter)
    return Activity(name=name, fn=fn, local=local, is_async=is_async, typed=typed, parameter=parameter)


async def invoke(activity: Activity, payload: bytes, executor: Executor) -> bytes:
    """Run one attempt of ``activity`` and return its result bytes.

    Coroutine functions run on the event loop; plain functions run in ``executor`` so that
    blocking code cannot stall the stream (heartbeats, cancels) for the whole worker. The
    caller's context variables are carried into the thread.
    """
    value: object
    fn: Callable[[Any], object] = activity.fn
    argument: object = _codec.decode(payload, activity.parameter) if activity.typed else payload
    if activity.is_async:
        value = fn(argument)
    else:
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, argument)
        value = await loop.run_in_executor(executor, call)
    if inspect.isawaitable(value):
        # A plain function that returns an awaitable (e.g. a lambda around a coroutine).
        value = await value
    if activity.typed:
        return b"" if value is None else _codec.encode(value)[0]
    return _to_bytes(activity.name, value)


def _to_bytes(name: str, value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"activity {name!r} returned {type(value).__name__}; return bytes, str or None")


def success_result(task: task_pb2.TaskRef, result: bytes) -> worker_pb2.TaskResult:
    return worker_pb2.TaskResult(task=task, success=result)


def failure_result(task: task_pb2.TaskRef, exc: BaseException) -> worker_pb2.TaskResult:
    """Describe a failed attempt: the class name is the error type the retry policy matches."""
    failure = task_pb2.TaskFailure(
        error_type=type(exc).__name__,
        message=_text(exc),
        non_retryable=isinstance(exc, NonRetryableError),
    )
    return worker_pb2.TaskResult(task=task, failure=failure)


def _text(exc: BaseException) -> str:
    """str(exc), or a word for an exception whose __str__ raises: its failure is reported all the same."""
    try:
        return str(exc)
    except Exception as broken:
        return f"{type(exc).__name__} cannot be turned into text ({type(broken).__name__} in its __str__)"
