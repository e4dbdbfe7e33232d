"""What every feed shares: the Feed protocol, FeedError, and JSON over HTTP with timeouts and
retries with jittered backoff.

A feed answers `current()` with one Reading, or raises FeedError when the answer is missing,
an error, late or not of the expected shape; the runner then keeps the last good value.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from lowtide.errors import LowtideError
from lowtide_proto.backoff import Backoff
from signal_service.domain import Point, Reading

log = logging.getLogger("lowtide.signal.feed")

# Worth another try: the service is overloaded or restarting. Any other error status is an
# answer (bad token, unknown zone) that the same request will get again.
_RETRYABLE = frozenset({429, 500, 502, 503, 504})


class FeedError(LowtideError):
    """The feed gave no usable answer; the last good value stays."""


class Unauthorized(FeedError):
    """The feed refused the credentials (HTTP 401)."""


class Feed(Protocol):
    # Recorded as the state's source, and the name of the feed in logs and counters.
    source: str
    unit: str

    async def current(self) -> Reading: ...

    async def forecast(self) -> list[Point]: ...

    def interval(self, refresh: float) -> float:
        """Seconds until the next poll, given the configured refresh."""
        ...

    async def aclose(self) -> None: ...


def parse_time(text: Any) -> datetime:
    """An ISO 8601 time from a feed (`2018-01-20T12:00Z`, `...00.000Z`); UTC when it names no zone."""
    if not isinstance(text, str):
        raise FeedError(f"expected a time, got {text!r}")
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise FeedError(f"expected an ISO 8601 time, got {text!r}") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def number(value: Any) -> float:
    """A JSON number; booleans and strings are not numbers, whatever Python thinks."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FeedError(f"expected a number, got {value!r}")
    return float(value)


class HttpJson:
    """GETs JSON from one base URL. Timeouts, connection errors and 429/5xx are retried with
    jittered exponential backoff (so replicas polling the same API do not retry in lockstep);
    anything else, and a body that is not JSON, fails at once with FeedError."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        attempts: int = 3,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._attempts = attempts
        self._backoff = (backoff_initial, backoff_max)
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=dict(headers or {}))

    async def get(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: httpx.Auth | None = None,
    ) -> Any:
        backoff = Backoff(initial=self._backoff[0], maximum=self._backoff[1])
        problem = ""
        for attempt in range(1, self._attempts + 1):
            try:
                response = await self._client.get(path, params=params, headers=headers, auth=auth)
            except httpx.TimeoutException:
                problem = f"no answer within {self._timeout:g}s"
            except httpx.RequestError as error:
                problem = f"{type(error).__name__}: {error}"
            else:
                status = response.status_code
                if status == 401:
                    raise Unauthorized(f"GET {path}: HTTP 401: {response.text[:200]}")
                if status in _RETRYABLE:
                    problem = f"HTTP {status}"
                elif status >= 400:
                    raise FeedError(f"GET {path}: HTTP {status}: {response.text[:200]}")
                else:
                    try:
                        return response.json()
                    except ValueError:
                        raise FeedError(f"GET {path}: malformed JSON: {response.text[:200]!r}") from None
            if attempt < self._attempts:
                delay = backoff.next_delay()
                log.info("feed.retrying", extra={"path": path, "problem": problem, "delay": round(delay, 3)})
                await asyncio.sleep(delay)
        raise FeedError(f"GET {path}: {problem} (after {self._attempts} tries)")

    async def aclose(self) -> None:
        await self._client.aclose()
