"""Numbered plain-SQL migrations (`NNNN_name.sql` in this package's migrations folder), applied
at startup in order, each in its own transaction, under a session advisory lock so that two
processes starting at once apply each migration exactly once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from lowtide.db.connector import wrap_exceptions

# Any fixed number will do; it only has to be the same in every lowtide process.
_LOCK_KEY = 0x6C6F77746964
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


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
            await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
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
                    async with conn.transaction():
                        await conn.execute(migration.sql)
                        await conn.execute(
                            "INSERT INTO lowtide.schema_migrations (version, name) VALUES (%s, %s)",
                            (migration.version, migration.name),
                        )
                    applied_now.append(migration.version)
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now
