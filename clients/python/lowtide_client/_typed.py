"""Typed submits: what ``Client.submit(train, Params(...))`` sends, and how its result is decoded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lowtide_client import _codec
from lowtide_proto.lowtide.v1 import task_pb2

__all__ = ["TaskNotCompleted", "activity_name", "encode_payload", "result_type"]


class TaskNotCompleted(Exception):
    """``Submitted.result()`` found the task finished otherwise (failed, cancelled...) or not yet
    finished when the wait ended; ``task`` is the task as it was then."""

    def __init__(self, task: task_pb2.Task) -> None:
        state = task_pb2.TaskState.Name(task.state)
        failure = task.last_failure
        detail = f": {failure.error_type}: {failure.message}" if task.HasField("last_failure") else ""
        super().__init__(f"task {task.id} is {state}{detail}")
        self.task = task


def activity_name(fn: Callable[..., Any]) -> str:
    """The activity type ``fn`` was registered as on a worker in this process, else its name."""
    name = getattr(fn, "__lowtide_activity__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"cannot tell the activity type of {fn!r}; pass its name as a str")
    return name


def result_type(fn: Callable[..., Any]) -> Any:
    _, returns = _codec.hints(fn)
    return returns


def encode_payload(value: object, headers: Mapping[str, str] | None) -> tuple[bytes, dict[str, str]]:
    data, content_type = _codec.encode(value)
    merged = dict(headers or {})
    if content_type is not None:
        merged.setdefault(_codec.CONTENT_TYPE, content_type)
    return data, merged
