"""``SyncClient``: the async ``Client`` for code without an event loop (scripts, web apps).

It runs its own event loop in a daemon thread and waits for each call there, so it is safe
to use from any thread (calls are serialised by that loop, not by a lock) and never touches
an event loop of the caller's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Generic, TypeVar, Unpack, overload

from lowtide_client._client import Client, Submitted
from lowtide_client._spec import TaskOptions
from lowtide_proto.lowtide.v1 import scheduler_pb2, task_pb2

__all__ = ["SyncClient", "SyncSubmitted"]

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class SyncSubmitted(Generic[_R]):
    """A task submitted with ``SyncClient.submit(fn, value)``; ``result()`` waits for it."""

    submitted: Submitted[_R]
    client: SyncClient

    @property
    def id(self) -> int:
        return self.submitted.id

    @property
    def task(self) -> task_pb2.Task:
        return self.submitted.task

    def result(self, *, timeout: timedelta = timedelta(seconds=30)) -> _R:
        """The task's decoded result (``TaskNotCompleted`` when it ended otherwise)."""
        return self.client._run(self.submitted.result(timeout=timeout))


class SyncClient:
    """Blocking ``submit``/``get``/``wait``/``list``/``cancel``/``retry``, ``pause_queue`` and
    ``resume_queue``; takes ``Client``'s arguments.

    Use it as ``with SyncClient(...) as client:`` or call ``close()``.
    """

    def __init__(self, target: str = "127.0.0.1:50051", **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lowtide-sync-client", daemon=True)
        self._thread.start()
        self._client = Client(target, **kwargs)
        self._closed = False

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if self._closed:
            coroutine.close()
            raise RuntimeError("this SyncClient is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel and stop the loop's thread. Safe to call more than once."""
        if self._closed:
            return
        self._run(self._client.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @overload
    def submit(
        self, activity_type: str, payload: bytes | str = b"", **options: Unpack[TaskOptions]
    ) -> task_pb2.Task: ...

    @overload
    def submit(
        self, activity_type: Callable[[_T], Awaitable[_R]], payload: _T, **options: Unpack[TaskOptions]
    ) -> SyncSubmitted[_R]: ...

    @overload
    def submit(
        self, activity_type: Callable[[_T], _R], payload: _T, **options: Unpack[TaskOptions]
    ) -> SyncSubmitted[_R]: ...

    def submit(
        self, activity_type: str | Callable[[Any], Any], payload: Any = b"", **options: Unpack[TaskOptions]
    ) -> task_pb2.Task | SyncSubmitted[Any]:
        """As ``Client.submit``: by name, the stored task; by function, a typed handle."""
        if isinstance(activity_type, str):
            return self._run(self._client.submit(activity_type, payload, **options))
        submitted = self._run(self._client.submit(activity_type, payload, **options))
        return SyncSubmitted(submitted=submitted, client=self)

    def get(self, task_id: int) -> task_pb2.Task:
        return self._run(self._client.get(task_id))

    def cancel(self, task_id: int) -> task_pb2.Task:
        return self._run(self._client.cancel(task_id))

    def retry(self, task_id: int, *, if_attempt: int | None = None) -> task_pb2.Task:
        return self._run(self._client.retry(task_id, if_attempt=if_attempt))

    def pause_queue(self, queue: str, *, create: bool = False) -> scheduler_pb2.QueueStatus:
        """As ``Client.pause_queue``: an unknown queue is NOT_FOUND unless ``create``."""
        return self._run(self._client.pause_queue(queue, create=create))

    def resume_queue(self, queue: str) -> scheduler_pb2.QueueStatus:
        return self._run(self._client.resume_queue(queue))

    def wait(self, task_id: int, *, timeout: timedelta = timedelta(seconds=30)) -> task_pb2.Task:
        return self._run(self._client.wait(task_id, timeout=timeout))

    def list(
        self,
        *,
        queue: str = "",
        state: task_pb2.TaskState.ValueType | int = task_pb2.TASK_STATE_UNSPECIFIED,
        activity_type: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> scheduler_pb2.ListTasksResponse:
        return self._run(
            self._client.list(
                queue=queue, state=state, activity_type=activity_type, page_size=page_size, page_token=page_token
            )
        )
