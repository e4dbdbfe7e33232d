"""The execute side: ``Worker`` runs registered activities for the tasks the scheduler assigns.

This module is the public face (configuration, registration, start and stop); the stream
protocol lives in ``_runtime`` and the bookkeeping of attempts in ``_attempts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

import grpc

from lowtide_client._activities import Activity, ActivityFunction, make_activity
from lowtide_client._holds import CostHold, local_conflicts
from lowtide_client._log import log_event
from lowtide_client._runtime import Runtime, Settings
from lowtide_proto.channel import Security, open_channel

__all__ = ["Worker"]

_F = TypeVar("_F", bound=ActivityFunction)


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Worker:
    """Runs registered activities for tasks the scheduler assigns.

    ``slots`` is how many attempts run at once; plain (sync) functions run in a thread pool
    of that size, coroutine functions on the event loop. ``worker_id`` defaults to
    ``host-pid-random``; it stays the same across reconnects within one process, which is
    what lets the scheduler hand a reconnecting worker back the attempts it still runs.

    Run it with ``await worker.run()`` (and ``worker.stop()`` from anywhere), or as
    ``async with Worker(...) as worker:``, which runs it in the background and stops it on
    exit. On stop the worker takes no new work, lets running attempts finish for up to
    ``shutdown_grace``, reports their results and closes the stream; attempts still
    running after that are abandoned, and the scheduler re-dispatches them.

    Log records go to the ``lowtide_client`` logger; see ``_log`` for their shape.
    """

    def __init__(
        self,
        *,
        target: str = "127.0.0.1:50051",
        pool: str = "default",
        queues: Sequence[str] = ("default",),
        slots: int = 10,
        worker_id: str | None = None,
        max_result_batch: int = 256,
        shutdown_grace: timedelta = timedelta(seconds=30),
        cost_deferrable_activities: Sequence[str] = (),
        cost_holds: Sequence[CostHold] = (),
        hold_check_interval: timedelta = timedelta(milliseconds=250),
        token: str | None = None,
        ca: str | bytes | None = None,
        cert: str | bytes | None = None,
        key: str | bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if isinstance(queues, str):
            raise TypeError("queues must be a sequence of queue names, not a single str")
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if max_result_batch < 1:
            raise ValueError("max_result_batch must be at least 1")
        if shutdown_grace < timedelta(0):
            raise ValueError("shutdown_grace must not be negative")
        self._settings = Settings(
            target=target,
            pool=pool,
            queues=tuple(queues),
            slots=slots,
            max_result_batch=max_result_batch,
            shutdown_grace=shutdown_grace.total_seconds(),
            cost_deferrable_activities=tuple(cost_deferrable_activities),
            cost_holds=tuple(cost_holds),
            hold_check_interval=hold_check_interval.total_seconds(),
        )
        self._worker_id = worker_id or _default_worker_id()
        # A token with the worker role when the scheduler has auth on; ca (cert and key for
        # mutual TLS) or credentials when it serves TLS.
        self._security = Security(token=token, ca=ca, cert=cert, key=key, credentials=credentials)
        self._activities: dict[str, Activity] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._stop_event = asyncio.Event()  # made again in run(), for its event loop
        self._background: asyncio.Task[None] | None = None

    @property
    def worker_id(self) -> str:
        """This worker's id (the scheduler's, if its Welcome named a different one)."""
        return self._worker_id

    def register(self, name: str, fn: ActivityFunction, *, local: bool = False) -> None:
        """Register ``fn`` as the activity ``name``.

        Typed first: ``fn(params: Params) -> Result``, where the annotations (a dataclass, a
        pydantic model, or JSON types) say how the payload is decoded and the result encoded
        (JSON, ``content-type: application/json``); ``Client.submit(fn, Params(...))`` submits
        one. A ``bytes`` (or unannotated) parameter takes the payload bytes as they are:
        ``fn(payload: bytes) -> bytes | str | None``.

        ``fn`` may be a plain function (run in the worker's thread pool, so blocking code
        cannot stall heartbeats) or a coroutine function (run on the event loop). Return
        bytes, a str (sent UTF-8 encoded) or None (an empty result). An exception fails the
        attempt, reported with its class name as the error type; raise ``NonRetryableError``
        to rule out retries. ``local`` activities are announced as such to the scheduler:
        they run inline in workflow tasks and are never queued. Register before ``run()``:
        the Hello that starts the stream lists the activities.
        """
        if self._loop is not None:
            raise RuntimeError("register activities before run(): the scheduler learns them from the hello")
        if name in self._activities:
            raise ValueError(f"activity {name!r} is already registered")
        self._activities[name] = make_activity(name, fn, local=local)
        with contextlib.suppress(AttributeError, TypeError):  # e.g. a bound method
            fn.__lowtide_activity__ = name  # type: ignore[attr-defined]  # Client.submit(fn) uses it

    def activity(self, name: str, *, local: bool = False) -> Callable[[_F], _F]:
        """Decorator form of ``register``: ``@worker.activity("resize")``; returns ``fn`` as is."""

        def decorate(fn: _F) -> _F:
            self.register(name, fn, local=local)
            return fn

        return decorate

    def stop(self) -> None:
        """Ask the worker to stop gracefully; returns at once (``run()`` returns when done).

        Safe from any thread and from signal handlers: the request reaches the event loop
        through ``call_soon_threadsafe``. Before ``run()`` it makes ``run()`` return right
        away; a second call changes nothing.
        """
        self._stop_requested = True
        loop = self._loop
        if loop is None:
            return
        # RuntimeError: the loop is closed, so run() is over anyway.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._stop_event.set)

    async def __aenter__(self) -> Worker:
        if self._background is not None:
            raise RuntimeError("this worker is already running")
        self._background = asyncio.create_task(self.run(), name="lowtide-worker")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._background = self._background, None
        if task is None:
            return
        self.stop()
        if exc is None:
            await task
            return
        # The body's exception is the one to see; a failure of run() as well is only logged.
        try:
            await task
        except Exception:
            log_event(logging.ERROR, "worker.run_failed", exc_info=True, worker_id=self._worker_id)

    async def run(self, *, install_signal_handlers: bool = False) -> None:
        """Connect and execute assigned attempts until ``stop()`` is carried out.

        Reconnects (with backoff, listing running attempts in the Hello) when the stream fails
        with UNAVAILABLE or the scheduler ends it, as after a Drain: the scheduler is going, so
        the worker takes no new work on that stream, finishes and reports what it runs, closes
        it and connects again. Any other gRPC status (a refused hello, or ABORTED when a newer
        stream took over this worker id) is raised as the ``grpc.aio.AioRpcError``. With
        ``install_signal_handlers``, SIGTERM and SIGINT call ``stop()`` (main thread only).
        """
        if not self._activities:
            raise RuntimeError("register at least one activity before run()")
        if self._loop is not None:
            raise RuntimeError("this worker is already running")
        held = set(self._settings.cost_deferrable_activities).union(*(h.types for h in self._settings.cost_holds))
        conflicts = local_conflicts(held, (a.name for a in self._activities.values() if a.local))
        if conflicts:
            raise ValueError(
                f"cost hold names local activity {', '.join(sorted(conflicts))}: a local activity runs inline "
                "in its workflow task, so a hold cannot defer it"
            )
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop_event = asyncio.Event()
        if self._stop_requested:
            self._stop_event.set()
        installed = self._install_signal_handlers(loop) if install_signal_handlers else []
        channel: Any = open_channel(self._settings.target, self._security)
        executor = ThreadPoolExecutor(max_workers=self._settings.slots, thread_name_prefix="lowtide-activity")
        runtime = Runtime(
            settings=self._settings,
            worker_id=self._worker_id,
            activities=dict(self._activities),
            executor=executor,
            stop_event=self._stop_event,
        )
        try:
            await runtime.serve(channel)
        finally:
            self._worker_id = runtime.worker_id
            # Threads still inside a sync activity finish on their own; nothing waits for them.
            executor.shutdown(wait=False, cancel_futures=True)
            await channel.close()
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._loop = None
            self._stop_requested = False
            log_event(logging.INFO, "worker.stopped", worker_id=self._worker_id)

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        installed: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError, ValueError):
                # Not the main thread, or a platform without loop signal handlers.
                log_event(logging.WARNING, "worker.signal_handler_unavailable", signal=sig.name)
                continue
            installed.append(sig)
        return installed
