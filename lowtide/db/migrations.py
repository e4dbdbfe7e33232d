"""Numbered plain-SQL migrations (`NNNN_name.sql` in this package's migrations folder), applied
at startup in order, each in its own transaction, under a session advisory lock so that two
processes starting at once apply each migration exactly once.

A migration whose first line is OUTSIDE runs outside a transaction instead, statement by statement:
what `CREATE INDEX CONCURRENTLY` needs, so that an index built on a large table in a rolling
upgrade does not stop the replicas still running from writing to it meanwhile (a plain CREATE
INDEX holds off every write until it is built: a minute for tens of millions of rows). Its
statements must each be safe to run again (`IF NOT EXISTS`): a start cut off midway runs them all
again, after dropping the invalid index an interrupted concurrent build leaves behind.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from lowtide.db.connector import wrap_exceptions

# Any fixed number will do; it only has to be the same in every lowtide process.
_LOCK_KEY = 0x6C6F77746964
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
OUTSIDE = "-- lowtide: outside a transaction"
# How often a starter asks again for the lock another starter holds while it migrates.
LOCK_RETRY = 0.2
# The indexes of lowtide's schema that an interrupted CREATE INDEX CONCURRENTLY left invalid.
_INVALID_INDEXES = """
SELECT c.relname FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'lowtide' AND NOT i.indisvalid
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def in_transaction(self) -> bool:
        return not self.sql.startswith(OUTSIDE)

    def statements(self) -> list[str]:
        """The statements of the file, one by one (comment lines left out; a statement ends with
        a semicolon)."""
        code = "\n".join(line for line in self.sql.splitlines() if not line.lstrip().startswith("--"))
        return [statement.strip() for statement in code.split(";") if statement.strip()]


def available_migrations() -> list[Migration]:
    folder = resources.files("lowtide.db").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


async def apply_migrations(url: str) -> list[int]:
    """Applies what is missing; returns the versions applied by this call."""
    applied_now: list[int] = []
    with wrap_exceptions():
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await _lock(conn)
            try:
                await conn.execute("CREATE SCHEMA IF NOT EXISTS lowtide")
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS lowtide.schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                cur = await conn.execute("SELECT version FROM lowtide.schema_migrations")
                done = {row[0] for row in await cur.fetchall()}
                for migration in available_migrations():
                    if migration.version in done:
                        continue
                    record = (
                        "INSERT INTO lowtide.schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                    if migration.in_transaction:
                        async with conn.transaction():
                            await conn.execute(migration.sql)
                            await conn.execute(*record)
                    else:
                        await _drop_invalid_indexes(conn)
                        for statement in migration.statements():
                            await conn.execute(statement)
                        await conn.execute(*record)
                    applied_now.append(migration.version)
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now


async def _drop_invalid_indexes(conn: psycopg.AsyncConnection[Any]) -> None:
    """Drops what an interrupted concurrent index build left: an invalid index that `IF NOT
    EXISTS` would take for a finished one."""
    cur = await conn.execute(_INVALID_INDEXES)
    for (name,) in await cur.fetchall():
        await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS lowtide.{}").format(sql.Identifier(name)))


async def _lock(conn: psycopg.AsyncConnection[Any]) -> None:
    """Takes the migrations' advisory lock, asking again every LOCK_RETRY seconds while another
    starter holds it. Not pg_advisory_lock: a statement waiting for it holds a snapshot, which a
    concurrent index build of the holder's waits for in turn (a deadlock)."""
    while True:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (_LOCK_KEY,))
        row = await cur.fetchone()
        if row is not None and row[0]:
            return
        await asyncio.sleep(LOCK_RETRY)
