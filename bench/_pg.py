"""PostgreSQL helpers shared by every benchmark: throwaway databases and server facts."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def with_database(url: str, dbname: str) -> str:
    """`url` with its database replaced by `dbname`.

    URLs rather than key=value conninfo strings throughout, because asyncpg (PgQueuer's driver)
    only takes URLs; query parameters such as sslmode or a socket `host=` are kept as they are.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"expected a postgresql:// URL, got {url!r}")
    return urlunsplit(parts._replace(path="/" + dbname))


async def create_database(server_url: str, prefix: str) -> str:
    """Create an empty database named `<prefix>_<random>` and return its URL."""
    dbname = f"{prefix}_{secrets.token_hex(4)}"
    # CREATE/DROP DATABASE cannot run inside a transaction block, hence autocommit.
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return with_database(server_url, dbname)


async def drop_database(server_url: str, database_url: str) -> None:
    """Drop the database that `database_url` names, disconnecting whoever is still on it.

    FORCE (PostgreSQL 13+) matters when a worker was killed mid-run and its backend lingers.
    """
    dbname = urlsplit(database_url).path.lstrip("/")
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


@asynccontextmanager
async def throwaway_database(server_url: str, prefix: str) -> AsyncIterator[str]:
    """A fresh database for one run, dropped on the way out whatever happened inside."""
    database_url = await create_database(server_url, prefix)
    try:
        yield database_url
    finally:
        await drop_database(server_url, database_url)


async def server_version(server_url: str) -> str:
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def vacuum_analyze(database_url: str, tables: list[str]) -> None:
    """VACUUM ANALYZE freshly loaded queue tables.

    Every run starts from the same state: planner statistics that know the table holds N rows,
    and no autovacuum/autoanalyze of the bulk load landing at a random moment inside the timing.
    """
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for table in tables:
            await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))


async def committed(conn: psycopg.AsyncConnection[Any]) -> int:
    """Transactions committed so far in the connection's database (pg_stat_database); this read
    counts as one."""
    cur = await conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
