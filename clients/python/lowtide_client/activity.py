"""What a running activity can know and do: ``lowtide_client.activity.context()``.

Inside an activity (async, or a plain function in the worker's threads) ``context()`` gives the
attempt it runs: the task id, attempt number, deadline, headers, a logger whose records carry
the task id, ``heartbeat(details)`` (the details are stored on the task and shown by
``lowtide task get``), and cancellation. When the scheduler cancels the attempt (or its
deadline passes, or the worker stops) an async activity gets ``asyncio.CancelledError`` at its
next ``await``; a plain function cannot be interrupted, so it checks ``ctx.cancelled`` (a
``threading.Event``) or calls ``ctx.raise_if_cancelled()``.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lowtide_client import _codec

__all__ = ["ActivityCancelled", "ActivityContext", "context"]

_current: contextvars.ContextVar[ActivityContext] = contextvars.ContextVar("lowtide_activity")

logger = logging.getLogger("lowtide_client.activity")

# Guards the first look at a context's `cancelled` (the worker's loop and an activity's thread
# may ask at once).
_making = threading.Lock()


class ActivityCancelled(Exception):
    """Raised by ``raise_if_cancelled()`` once the attempt was cancelled; its result is not used."""


@dataclass(eq=False, slots=True)
class ActivityContext:
    task_id: int
    attempt: int
    activity_type: str
    #: The start-to-close deadline on the scheduler's clock (aware, UTC), or None.
    deadline: datetime | None
    headers: Mapping[str, str]
    _report: Callable[[bytes], object] = field(default=lambda _: None, repr=False)
    _cancelled: threading.Event | None = field(default=None, repr=False)

    @property
    def cancelled(self) -> threading.Event:
        """Set when the attempt is cancelled (by the scheduler, its deadline, or the worker
        stopping). Made when first asked for, from any thread: most attempts never ask, and a
        threading.Event per attempt was a tenth of a no-op worker's CPU."""
        event = self._cancelled
        if event is None:
            with _making:
                if self._cancelled is None:
                    self._cancelled = threading.Event()
                event = self._cancelled
        return event

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """``lowtide_client.activity`` records with ``task_id`` and ``attempt`` attached (as
        attributes of the record, and in the message)."""
        return _TaskLogger(logger, {"task_id": self.task_id, "attempt": self.attempt})

    def heartbeat(self, details: object = None) -> None:
        """Report progress: sent with the worker's next heartbeat (within a fraction of a second)
        and stored on the task. ``details`` is bytes (as is), a str (UTF-8), or anything JSON
        can encode (a dataclass too); at most 4096 bytes encoded. Safe from any thread."""
        if details is None:
            data = b""
        elif isinstance(details, str):
            data = details.encode()
        else:
            data = _codec.encode(details)[0]
        if len(data) > 4096:
            raise ValueError(f"heartbeat details are {len(data)} bytes; the limit is 4096")
        self._report(data)

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def raise_if_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise ActivityCancelled(f"task {self.task_id} attempt {self.attempt} was cancelled")


class _TaskLogger(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = dict(self.extra or {})
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"task_id={extra['task_id']} attempt={extra['attempt']} {msg}", kwargs


def context() -> ActivityContext:
    """The context of the activity running here; ``LookupError`` outside an activity."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("lowtide_client.activity.context() is only available inside a running activity") from None


def _enter(ctx: ActivityContext) -> contextvars.Token[ActivityContext]:
    return _current.set(ctx)
