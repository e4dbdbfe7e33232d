"""Fan-out of signal changes to subscribers, modelled on grpc_health's asyncio `Watch`.

The fan-out keeps the latest state of each signal. Each subscriber owns one slot holding only the
latest state it has not taken yet, plus the future it waits on while the slot is empty. Publishing
overwrites the slot and wakes the waiter; it never awaits, so a slow or stuck subscriber (one whose
gRPC stream is blocked by flow control) cannot delay anybody else. A slow subscriber may therefore
skip intermediate states, but the last one is always waiting in its slot.

A bare future rather than grpc_health's asyncio.Event: waking runs once per subscriber per change,
on the event loop that also writes every stream, and with Event.set/wait a wake-up and take costs
about 5 µs against 3 µs with a future (1,000 subscribers): 2 ms less per change to send.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from signal_service.domain import SignalState


class Closed(Exception):
    """The fan-out was closed (the service is stopping); the subscriber should reconnect."""


class Subscription:
    """One subscriber's slot: `next()` gives the newest state not taken yet, each at most once."""

    __slots__ = ("_closed", "_pending", "_waiter", "name")

    def __init__(self, name: str, current: SignalState | None) -> None:
        self.name = name
        self._pending = current
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        # Done already when the subscriber was cancelled while waiting, or woken twice.
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        self._closed = True
        self._wake()

    @property
    def pending(self) -> SignalState | None:
        """The state waiting to be taken, if any."""
        return self._pending

    def offer(self, state: SignalState) -> None:
        self._pending = state
        self._wake()

    async def next(self) -> SignalState:
        """The latest state not taken yet, waiting for one if needed; Closed once closed."""
        while True:
            if self._closed:
                raise Closed
            state = self._pending
            if state is not None:
                self._pending = None
                return state
            # Only this subscriber's task awaits its waiter, so cancelling that task (the client
            # went away) cancels nothing that another subscriber waits on.
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class Fanout:
    def __init__(self) -> None:
        self._latest: dict[str, SignalState] = {}
        self._subscribers: dict[str, set[Subscription]] = {}
        self._closed = False

    def close(self) -> None:
        """Ends every subscription (now and later): a stopping server would otherwise wait its
        whole grace period for streams that never end on their own."""
        self._closed = True
        for subscriptions in self._subscribers.values():
            for subscription in subscriptions:
                subscription.close()

    def latest(self, name: str) -> SignalState | None:
        return self._latest.get(name)

    def all(self) -> list[SignalState]:
        return [self._latest[name] for name in sorted(self._latest)]

    def publish(self, state: SignalState) -> bool:
        """Makes `state` the latest and offers it to every subscriber of its signal.

        The same change arrives twice (from this replica's own write and from its NOTIFY), and
        NOTIFYs may be read out of order with writes; versions only grow, so anything not newer
        than what is held is dropped. Returns whether the state was new.
        """
        held = self._latest.get(state.name)
        if held is not None and state.version <= held.version:
            return False
        self._latest[state.name] = state
        for subscription in self._subscribers.get(state.name, ()):
            subscription.offer(state)
        return True

    def subscriptions(self, name: str) -> tuple[Subscription, ...]:
        return tuple(self._subscribers.get(name, ()))

    @property
    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())

    @contextlib.contextmanager
    def subscribe(self, name: str) -> Iterator[Subscription]:
        """A subscription that starts with the current state (if any); removed on exit, however
        the subscriber leaves (cancelled stream, client gone, server stopping)."""
        subscription = Subscription(name, self._latest.get(name))
        if self._closed:
            subscription.close()
        self._subscribers.setdefault(name, set()).add(subscription)
        try:
            yield subscription
        finally:
            subscribers = self._subscribers.get(name)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscribers[name]
