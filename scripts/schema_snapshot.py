"""Write lowtide/db/schema.sql, the schema the migrations make, table by table (run by `make schema`
after adding a migration; a test fails until it is run).

The migrations are applied to a new, empty database of the server `LOWTIDE_DATABASE_URL` (or
`LOWTIDE_TEST_DATABASE_URL`) names, which pg_dump then reads; the database is dropped afterwards.
pg_dump's output is regrouped so that each table stands whole in one place: its columns, then its
keys, checks and indexes; a table comes after those its foreign keys name.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from psycopg import conninfo

from lowtide.db import apply_migrations
from lowtide.db.migrations import available_migrations

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "lowtide" / "db" / "schema.sql"

# pg_dump opens each object with "-- Name: NAME; Type: TYPE; Schema: lowtide; Owner: -".
_OBJECT = re.compile(r"^--\n-- Name: ([^;]+); Type: ([^;]+); Schema: ([^;]+);.*\n--\n", re.MULTILINE)
_TABLE_OF = re.compile(r"(?:ALTER TABLE(?: ONLY)?|ON(?: ONLY)?) lowtide\.(\w+)")
_REFERENCES = re.compile(r"REFERENCES lowtide\.(\w+)")


def header(version: int, name: str) -> str:
    return (
        f"-- lowtide's schema after migration {version:04d}_{name}.sql: what the migrations in\n"
        "-- lowtide/db/migrations make, one table whole in one place. Written by `make schema`\n"
        "-- (scripts/schema_snapshot.py), never by hand; the migrations are what a database runs.\n"
    )


def _objects(dump: str) -> list[tuple[str, str, str]]:
    """(type, name, statement) of every object of the lowtide schema, in pg_dump's order."""
    marks = list(_OBJECT.finditer(dump))
    objects = []
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        end = following.start() if following else len(dump)
        statement = "\n".join(
            line for line in dump[mark.end() : end].splitlines() if line and not line.startswith(("SET ", "\\"))
        )
        if mark[3] == "lowtide" and statement.strip():
            objects.append((mark[2], mark[1], statement.strip()))
    return objects


def regroup(dump: str) -> str:
    """pg_dump's schema-only output as one section per table."""
    tables: dict[str, list[str]] = {}
    after: dict[str, set[str]] = {}
    for kind, name, statement in _objects(dump):
        if kind == "TABLE":
            tables.setdefault(name, []).insert(0, statement)
            continue
        found = _TABLE_OF.search(statement)
        if found is None:
            raise ValueError(f"{kind} {name}: no table found in {statement!r}")
        table = found[1]
        tables.setdefault(table, []).append(statement)
        after.setdefault(table, set()).update(t for t in _REFERENCES.findall(statement) if t != table)
    ordered: list[str] = []
    while len(ordered) < len(tables):
        ready = sorted(t for t in tables if t not in ordered and after.get(t, set()) <= set(ordered))
        if not ready:
            raise ValueError("foreign keys in a circle: no order of tables works")
        ordered.append(ready[0])
    sections = ["CREATE SCHEMA IF NOT EXISTS lowtide;"]
    sections += ["\n\n".join(tables[table]) for table in ordered]
    return "\n\n\n".join(sections) + "\n"


def snapshot(server_url: str) -> str:
    """The text of schema.sql for the migrations as they are now."""
    name = f"lowtide_schema_{uuid.uuid4().hex[:10]}"
    url = conninfo.make_conninfo(server_url, dbname=name)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        asyncio.run(apply_migrations(url))
        dump = subprocess.run(
            ["pg_dump", "--schema-only", "--schema=lowtide", "--no-owner", "--no-privileges", "--dbname", url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    last = available_migrations()[-1]
    return header(last.version, last.name) + "\n" + regroup(dump)


def main() -> int:
    url = os.environ.get("LOWTIDE_DATABASE_URL") or os.environ.get("LOWTIDE_TEST_DATABASE_URL")
    if not url:
        print("schema_snapshot: set LOWTIDE_DATABASE_URL to a PostgreSQL server to migrate a scratch database on")
        return 2
    SCHEMA.write_text(snapshot(url))
    print(f"wrote {SCHEMA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
