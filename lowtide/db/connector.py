"""The connector: a psycopg 3 async pool behind a small surface.

`wrap_exceptions` turns driver errors into lowtide's own, so callers never import psycopg: a lost
or unreachable server becomes DatabaseUnavailable (UNAVAILABLE to a gRPC client, never a silent
success).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import conninfo, pq
from psycopg.rows import BaseRowFactory, class_row, dict_row
from psycopg.types.array import ListBinaryDumper

from lowtide.db.queries import Positional
from lowtide.errors import DatabaseUnavailable

Row = dict[str, Any]
Params = Mapping[str, Any]
T = TypeVar("T")


@contextlib.contextmanager
def wrap_exceptions() -> Iterator[None]:
    try:
        yield
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg.errors.AdminShutdown) as error:
        raise DatabaseUnavailable(f"database unavailable: {str(error).strip() or type(error).__name__}") from error


def statement_aborted(error: BaseException) -> bool:
    """Whether a DatabaseUnavailable was a statement the server answered by aborting it (a
    deadlock or serialization victim, a statement or lock timeout, a cancel), the connection
    alive: trying again without what blocked it may succeed at once."""
    cause = error.__cause__
    state = getattr(cause, "sqlstate", None) or ""
    return isinstance(cause, psycopg.Error) and (state.startswith("40") or state in ("55P03", "57014"))


class CommittedUnread(Exception):
    """A statement run on its own (committed alone) committed, but its rows could not be read
    (a value no loader takes, a row class they do not fit). Unlike a statement the server
    refused, it must not be tried again: it would store what it stored a second time."""


async def _run_alone(cur: Any, query: Any, params: Any) -> list[Any]:
    """The rows of a statement `cur` runs on its own (autocommit). An error once the server has
    answered it (in making or reading the rows, psycopg's loaders or the row class) raises
    CommittedUnread: the statement has committed."""
    try:
        await cur.execute(query, params)
        return await cur.fetchall() if _returns_rows(cur) else []
    except Exception as error:
        result = cur.pgresult
        if result is not None and result.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise CommittedUnread(f"the statement committed, but its rows could not be read: {error!r}") from error
        raise


def conninfo_problem(url: str) -> str | None:
    """What is wrong with a connection string (a postgresql:// URL or key=value pairs), in
    libpq's words; None when it parses. A string that may hold a password is not quoted back."""
    try:
        params = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as error:
        message = " ".join(str(error).split())
        if "@" in url or "password" in url.lower():
            message = re.sub(r'"[^"]*"', '"..."', message)
        return f"not a PostgreSQL URL (postgresql://user@host:5432/dbname) or key=value string: {message}"
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return f"the port must be a number from 1 to 65535, not {port!r}"
    return None


def typed_row(cls: type[T]) -> BaseRowFactory[T]:
    """psycopg's `class_row` for a frozen dataclass; for a typed NamedTuple (the rows of the hot
    path: claims and completions) the values go into the tuple as they come, without a keyword
    dict and an __init__ call per row. Either way the query's columns must be the class's fields:
    for a NamedTuple, in its order, checked once per statement rather than once per row."""
    fields: tuple[str, ...] | None = getattr(cls, "_fields", None)
    if fields is None or not issubclass(cls, tuple):
        return class_row(cls)
    make: Callable[[Sequence[Any]], T] = functools.partial(tuple.__new__, cls)

    def factory(cursor: Any) -> Callable[[Sequence[Any]], T]:
        if not _returns_rows(cursor):
            return make  # no rows to make (a statement without RETURNING)
        result = cursor.pgresult
        names = tuple(result.fname(i).decode() for i in range(result.nfields))
        if names != fields:
            raise TypeError(f"{cls.__name__} has the fields {fields}, the query returns the columns {names}")
        return make

    return factory


def _with_last_column(cls: type[T]) -> BaseRowFactory[tuple[T, Any]]:
    """Rows as (a `cls` made of every column but the last, by name; the last column's value).
    Where those columns are the dataclass's fields in its order (the group insert's whole
    tasks), the values go to it as they come, without a keyword dict per row."""
    in_order = tuple(field.name for field in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None

    def factory(cursor: Any) -> Callable[[Sequence[Any]], tuple[T, Any]]:
        # The names from the result: `cursor.description` makes a Column object for each.
        result = cursor.pgresult
        fields = tuple(result.fname(i).decode() for i in range(result.nfields - 1))
        if fields == in_order:
            return lambda values: (cls(*values[:-1]), values[-1])
        return lambda values: (cls(**dict(zip(fields, values, strict=False))), values[-1])

    return factory


def _returns_rows(cursor: psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned columns (a SELECT, a RETURNING): what `cursor.description`
    tells, without the Column object per column it makes each time (57 for a whole task)."""
    result = cursor.pgresult
    return result is not None and result.nfields > 0


class Transaction:
    """One connection inside a transaction. Obtained from `Database.transaction()`."""

    def __init__(self, conn: psycopg.AsyncConnection[Row]) -> None:
        self._conn = conn

    async def fetch(self, sql: str, params: Params | None = None) -> list[Row]:
        with wrap_exceptions():
            cur = await self._conn.execute(sql, params)
            return await cur.fetchall() if _returns_rows(cur) else []

    async def fetch_one(self, sql: str, params: Params | None = None) -> Row | None:
        rows = await self.fetch(sql, params)
        return rows[0] if rows else None

    async def fetch_as(self, cls: type[T], sql: str, params: Params | None = None) -> list[T]:
        """The rows as `cls` values (a frozen dataclass or a typed NamedTuple whose fields are the
        query's columns, see `typed_row`): a column the class does not name, or a field no column
        fills, fails at once rather than a key missing later."""
        with wrap_exceptions():
            async with self._conn.cursor(row_factory=typed_row(cls)) as cur:
                await cur.execute(sql, params)
                return await cur.fetchall() if _returns_rows(cur) else []

    async def fetch_one_as(self, cls: type[T], sql: str, params: Params | None = None) -> T | None:
        rows = await self.fetch_as(cls, sql, params)
        return rows[0] if rows else None

    async def execute(self, sql: str, params: Params | None = None) -> int:
        with wrap_exceptions():
            cur = await self._conn.execute(sql, params)
            return cur.rowcount


# Every statement but the claims' and the group inserts' is planned by PostgreSQL on every
# execution, for its values and for the tables as they are then: the main pool never prepares one.
# A plan PostgreSQL keeps is made with the tables as they are when it is made, and kept until
# autovacuum analyzes them again: on a fresh database that is an all but empty lowtide.tasks, where
# a sequential scan costs less than an index probe, and the plan was kept while the table grew by
# thousands of rows a second. Kept so (psycopg prepared a statement run five times, and PostgreSQL
# found its generic plan no dearer than the custom ones), a finish of reports scanned the whole
# table for each report (50 ms for one finish once 40,000 tasks were stored), and a score of other
# statements (heartbeats, hand-backs, the leader's tick, dependencies) read every pending or
# running task (tests/integration/test_generic_plans_audit.py). Planning costs PostgreSQL some
# 0.05-0.5 ms a statement, which batches share.
#
# The dispatcher's claims run on connections of their own, where each statement is prepared once
# and keeps PostgreSQL's generic plan: a claim is one big statement (candidates per (queue, type),
# window functions, the slots it fills) whose custom plan took about as long to make, every time,
# as the claim took to run, while its plan never depends on the values it is given (the candidate
# walk is the same index scan for any queue, type or cap). The insert of a group of single submits
# (SubmitTask) runs there too: for a group of one its custom plans looked cheaper than the generic
# one, so PostgreSQL kept planning it anew on every execution, about half of the 1.1 ms of backend
# CPU the insert cost. Each statement run there is written so that no plan of it reads rows it
# does not take, on a table of any size (test_planned_connections, test_generic_plans_audit), and
# sequential scans are off there: a plan made just after autovacuum analyzed the first few hundred
# tasks (8 pages, where a sequential scan costs less than one index probe) looked up each
# candidate a claim chose by a scan of the whole table, 7,700,000 rows read for one claim once
# 60,000 tasks were stored. Nor is anything compiled there (JIT): a scan left without an index (the
# paused queues) carries the planner's penalty for a disabled scan, which put every claim over
# `jit_above_cost`, and compiling it took 30 ms to 2 s a claim.
_GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c jit=off"


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Lists go to the server in PostgreSQL's binary array format. The batches of the hot path
    pass one array per column (a finish of 256 attempts is nine arrays of 256): psycopg's text
    format quotes every element through a regular expression, about four times the cost of the
    binary one, which only packs them. Every statement casts its arrays (`%(ids)s::bigint[]`).

    The session's time zone is UTC, whatever the server's default (Debian's is 'Etc/UTC'): psycopg
    then loads every timestamptz with Python's own UTC, not a ZoneInfo, and the arithmetic between
    them and `datetime.now(UTC)` on the hot path (the task histograms' timings) skips a UTC-offset
    lookup on each side, 0.8 -> 0.3 us a subtraction. Nothing stored depends on it: every column
    is a timestamptz and no statement converts one to local time."""
    conn.adapters.register_dumper(list, ListBinaryDumper)
    await conn.execute("SET TIME ZONE 'UTC'")


def _pool(
    url: str, min_size: int, max_size: int, **kwargs: Any
) -> psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Row]]:
    return psycopg_pool.AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True, "row_factory": dict_row, **kwargs},
        configure=_configure,
        # A pool that cannot get a connection in this time fails the request instead
        # of hanging it while the database is away.
        timeout=5.0,
        reconnect_timeout=0,
    )


class Database:
    def __init__(
        self, url: str, *, min_size: int = 2, max_size: int = 16, planned_min: int = 0, planned_max: int = 4
    ) -> None:
        self.url = url
        # Never prepared: planned for the tables as they are, on every execution (see _GENERIC_PLANS).
        self._pool = _pool(url, min_size, max_size, prepare_threshold=None)
        # For statements run with `planned=True` (see _GENERIC_PLANS): the scheduler keeps one open,
        # so a claim on a queue idle for a while does not wait for a connection first.
        self._planned = _pool(url, planned_min, planned_max, options=_GENERIC_PLANS, prepare_threshold=0)
        # The connection `ping` keeps for itself (None until the first ping, or after a failure).
        self._ping_conn: psycopg.AsyncConnection[Row] | None = None

    async def open(self, *, wait: bool = True) -> None:
        with wrap_exceptions():
            await self._pool.open(wait=wait, timeout=10.0)
            await self._planned.open(wait=wait, timeout=10.0)

    async def close(self) -> None:
        await self._drop_ping_connection()
        await self._planned.close()
        await self._pool.close()

    async def ping(self, sql: str, *, within: float) -> str | None:
        """Whether the server answers `sql` within `within` seconds: None when it does, else what went
        wrong. It runs on a connection of its own, so a busy pool does not read as a database
        that is away, and a connection that failed is replaced on the next ping."""
        try:
            async with asyncio.timeout(within):
                if self._ping_conn is None or self._ping_conn.closed:
                    self._ping_conn = await psycopg.AsyncConnection.connect(
                        self.url, autocommit=True, row_factory=dict_row, connect_timeout=max(1, round(within))
                    )
                await self._ping_conn.execute(sql)
            return None
        except (psycopg.Error, OSError, TimeoutError) as error:
            await self._drop_ping_connection()
            return str(error).strip() or type(error).__name__

    async def _drop_ping_connection(self) -> None:
        conn, self._ping_conn = self._ping_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 1.0)

    @contextlib.asynccontextmanager
    async def transaction(self, *, planned: bool = False) -> AsyncIterator[Transaction]:
        """`planned`: on the connections whose statements keep one generic plan (_GENERIC_PLANS)."""
        pool = self._planned if planned else self._pool
        with wrap_exceptions():
            async with pool.connection() as conn, conn.transaction():
                yield Transaction(conn)

    async def fetch(self, sql: str, params: Params | None = None) -> list[Row]:
        with wrap_exceptions():
            async with self._pool.connection() as conn:
                return await Transaction(conn).fetch(sql, params)

    async def fetch_one(self, sql: str, params: Params | None = None) -> Row | None:
        rows = await self.fetch(sql, params)
        return rows[0] if rows else None

    async def fetch_as(self, cls: type[T], sql: str, params: Params | None = None, *, planned: bool = False) -> list[T]:
        """See `Transaction.fetch_as`; `planned` as for `transaction`. The statement commits on
        its own: rows it returned that cannot be read raise CommittedUnread."""
        pool = self._planned if planned else self._pool
        with wrap_exceptions():
            async with pool.connection() as conn, conn.cursor(row_factory=typed_row(cls)) as cur:
                return await _run_alone(cur, sql, params)

    async def fetch_one_as(self, cls: type[T], sql: str, params: Params | None = None) -> T | None:
        rows = await self.fetch_as(cls, sql, params)
        return rows[0] if rows else None

    async def fetch_positional(
        self, cls: type[T], query: Positional, params: Params, *, planned: bool = False
    ) -> list[tuple[T, Any]]:
        """The rows of a statement run on its own (committed alone), written with PostgreSQL's
        placeholders (a `Positional`: a text psycopg would parse again on every execution): each
        as a `cls` value made of every column but the last, and that last column's value.
        `planned` as for `transaction`; rows that cannot be read raise CommittedUnread."""
        pool = self._planned if planned else self._pool
        with wrap_exceptions():
            async with (
                pool.connection() as conn,
                psycopg.AsyncRawCursor(conn, row_factory=_with_last_column(cls)) as cur,
            ):
                return await _run_alone(cur, query.text, query.values(params))

    async def execute(self, sql: str, params: Params | None = None) -> int:
        with wrap_exceptions():
            async with self._pool.connection() as conn:
                return await Transaction(conn).execute(sql, params)

    @contextlib.asynccontextmanager
    async def listen(self, *channels: str) -> AsyncIterator[AsyncIterator[str]]:
        """A dedicated connection LISTENing on the channels; yields an iterator of payloads."""
        with wrap_exceptions():
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        try:
            for channel in channels:
                await conn.execute(f'LISTEN "{channel}"')

            async def payloads() -> AsyncIterator[str]:
                with wrap_exceptions():
                    async for notify in conn.notifies():
                        yield f"{notify.channel}:{notify.payload}"

            yield payloads()
        finally:
            with contextlib.suppress(Exception):
                await conn.close()
