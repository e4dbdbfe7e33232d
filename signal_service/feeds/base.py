"""What every feed shares: the Feed protocol, FeedError, and JSON over HTTP with timeouts,
a bounded body, retries with jittered backoff, and the API's `Retry-After` honoured.

A feed answers `current()` with one Reading, or raises FeedError when the answer is missing,
an error, late or not of the expected shape; the runner then keeps the last good value.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx

from lowtide.errors import LowtideError
from lowtide_proto.backoff import Backoff
from signal_service.domain import Point, Reading

log = logging.getLogger("lowtide.signal.feed")

# Worth another try: the service is overloaded or restarting. Any other error status is an
# answer (bad token, unknown zone) that the same request will get again.
_RETRYABLE = frozenset({429, 500, 502, 503, 504})
# The statuses whose Retry-After says when the API will take a request again (RFC 9110 10.2.3).
_RETRY_AFTER_STATUSES = frozenset({429, 503})
# The longest wait a Retry-After may impose: an API that asks for a day (or sends a date far
# off by mistake) still gets asked again within the hour.
RETRY_AFTER_MAX = 3600.0
# No grid API answers more than a few hundred kilobytes (a 72-hour forecast at 5 minutes is
# about 100 kB); a body past this is refused before it is parsed.
MAX_BODY_BYTES = 4 * 1024 * 1024


class FeedError(LowtideError):
    """The feed gave no usable answer; the last good value stays."""


class HttpStatusError(FeedError):
    """The API answered with an error status; `body` is the answer (bounded), for a feed whose
    API explains the error in it."""

    def __init__(self, message: str, *, status: int, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Unauthorized(HttpStatusError):
    """The feed refused the credentials (HTTP 401)."""


class RateLimited(FeedError):
    """The API asked, with Retry-After, not to be asked again before `until` (HttpJson's clock)."""

    def __init__(self, message: str, *, until: float) -> None:
        super().__init__(message)
        self.until = until


class Waiting(FeedError):
    """No request was sent: the API's Retry-After has not passed yet. Not a failed answer, so
    the runner does not count it as one."""


class ForecastUnavailable(FeedError):
    """The API does not give this account forecasts (a plan without them); asking again soon
    would get the same answer."""


class Feed(Protocol):
    # Recorded as the state's source, and the name of the feed in logs and counters.
    source: str
    unit: str
    # False: the feed has no forecast in its unit, and the runner never asks it for one.
    has_forecast: bool

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


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds (`120`) or an HTTP-date
    (`Wed, 21 Oct 2026 07:28:00 GMT`), at most RETRY_AFTER_MAX; a date already passed is 0.
    None when there is no header or it is neither form (the usual backoff applies then)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), RETRY_AFTER_MAX)
    try:
        at = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if at.tzinfo is None:
        # RFC 9110 dates are always GMT; parsedate gives a naive time for `-0000`.
        at = at.replace(tzinfo=UTC)
    return min(max((at - now).total_seconds(), 0.0), RETRY_AFTER_MAX)


def _now() -> datetime:
    return datetime.now(UTC)


class HttpJson:
    """GETs JSON (or, with get_bytes, any body) from one base URL. Timeouts, connection errors
    and 429/5xx are retried with jittered exponential backoff (so replicas polling the same API
    do not retry in lockstep); anything else, a body that is not JSON and a body over
    `max_bytes` fail at once with FeedError.

    A 429 or 503 with Retry-After is obeyed: no request leaves before that time. A wait no
    longer than the backoff's maximum is slept within the call and the request retried; a
    longer one ends the call with RateLimited, and until it has passed every call fails at
    once with Waiting, sending nothing. `blocked_for()` says how long is left, so the runner
    can poll no earlier.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        attempts: int = 3,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = MAX_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = _now,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._attempts = attempts
        self._backoff = (backoff_initial, backoff_max)
        self._max_bytes = max_bytes
        self._clock = clock
        self._wall_clock = wall_clock
        self._not_before = 0.0
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=dict(headers or {}))

    def blocked_for(self) -> float:
        """Seconds until the API's Retry-After has passed (0 when it has, or there was none)."""
        return max(self._not_before - self._clock(), 0.0)

    async def get(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: httpx.Auth | None = None,
    ) -> Any:
        """The answer's JSON."""
        body = await self.get_bytes(path, params=params, headers=headers, auth=auth)
        try:
            return json.loads(body)
        except ValueError:
            raise FeedError(f"GET {path}: malformed JSON: {_text(body)!r}") from None

    async def get_bytes(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: httpx.Auth | None = None,
    ) -> bytes:
        """The answer's body as sent (at most max_bytes), for an API that does not speak JSON."""
        if (left := self.blocked_for()) > 0:
            raise Waiting(f"GET {path}: not sent; the API asked to wait another {left:.0f}s (Retry-After)")
        backoff = Backoff(initial=self._backoff[0], maximum=self._backoff[1])
        problem = ""
        for attempt in range(1, self._attempts + 1):
            wait: float | None = None
            try:
                status, body, response_headers = await self._fetch(path, params, headers, auth)
            except (httpx.TimeoutException, TimeoutError):
                problem = f"no answer within {self._timeout:g}s"
            except httpx.RequestError as error:
                problem = f"{type(error).__name__}: {error}"
            else:
                if status == 401:
                    raise Unauthorized(f"GET {path}: HTTP 401: {_text(body)}", status=status)
                if status in _RETRYABLE:
                    problem = f"HTTP {status}"
                    if status in _RETRY_AFTER_STATUSES:
                        wait = self._obey_retry_after(path, status, response_headers.get("retry-after"))
                elif status >= 400:
                    raise HttpStatusError(f"GET {path}: HTTP {status}: {_text(body)}", status=status, body=body)
                else:
                    return body
            if wait and (wait > self._backoff[1] or attempt == self._attempts):
                raise RateLimited(
                    f"GET {path}: {problem}, asked to wait {wait:g}s (Retry-After)", until=self._not_before
                )
            if attempt < self._attempts:
                delay = max(backoff.next_delay(), wait or 0.0)
                log.info("feed.retrying", extra={"path": path, "problem": problem, "delay": round(delay, 3)})
                await asyncio.sleep(delay)
        raise FeedError(f"GET {path}: {problem} (after {self._attempts} tries)")

    async def _fetch(
        self,
        path: str,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
        auth: httpx.Auth | None,
    ) -> tuple[int, bytes, httpx.Headers]:
        """One request: its status, its body (at most max_bytes) and its headers, all within
        the timeout (httpx's own bounds each read, so a slowly dripping body needs this one)."""
        async with asyncio.timeout(self._timeout):
            return await self._read(path, params, headers, auth)

    async def _read(
        self,
        path: str,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str] | None,
        auth: httpx.Auth | None,
    ) -> tuple[int, bytes, httpx.Headers]:
        request = self._client.build_request("GET", path, params=params, headers=headers)
        response = await self._client.send(request, auth=auth, stream=True)
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_bytes:
                raise FeedError(f"GET {path}: the answer is {declared} bytes, over the {self._max_bytes} accepted")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self._max_bytes:
                    raise FeedError(f"GET {path}: the answer is over the {self._max_bytes} bytes accepted")
            return response.status_code, bytes(body), response.headers
        finally:
            await response.aclose()

    def _obey_retry_after(self, path: str, status: int, header: str | None) -> float | None:
        wait = retry_after(header, self._wall_clock())
        if wait is None:
            return None
        self._not_before = max(self._not_before, self._clock() + wait)
        capped = wait >= RETRY_AFTER_MAX
        log.warning(
            "feed.retry_after",
            extra={"path": path, "status": status, "retry_after": header, "wait": round(wait, 3), "capped": capped},
        )
        return wait

    async def aclose(self) -> None:
        await self._client.aclose()


def _text(body: bytes) -> str:
    """The start of an answer's body, for an error message."""
    return body[:200].decode("utf-8", errors="replace")
