"""lowtide/db/schema.sql, the schema a reader sees whole, is the schema the migrations make: it names
the last migration, and a database made from it has the same tables, columns, keys, checks and
indexes as a migrated one. A migration added without `make schema` fails here."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from lowtide.db.migrations import available_migrations
from tests.conftest import with_dbname

SCHEMA = Path(__file__).resolve().parents[2] / "lowtide" / "db" / "schema.sql"

# What the catalog says of the lowtide schema, each row rendered as PostgreSQL renders it.
_CATALOG = {
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               rank() OVER (PARTITION BY c.relname ORDER BY a.attnum)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = 'lowtide' AND c.relkind IN ('r', 'p', 'v') AND a.attnum > 0 AND NOT a.attisdropped
    """,
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'lowtide'::regnamespace
    """,
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'lowtide'",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by FROM pg_sequences
        WHERE schemaname = 'lowtide'
    """,
    "functions": """
        SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = 'lowtide'::regnamespace
    """,
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'lowtide'::regnamespace AND NOT tgisinternal
    """,
}


def catalog(url: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: sorted(conn.execute(query).fetchall(), key=repr) for name, query in _CATALOG.items()}


@pytest.fixture
def from_snapshot(pg_server_url: str) -> Iterator[str]:
    """A database whose schema comes from schema.sql alone, not the migrations."""
    name = f"lowtide_snap_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_dbname(pg_server_url, name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SCHEMA.read_text().encode())
        yield url
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_snapshot_is_of_the_last_migration() -> None:
    last = available_migrations()[-1]
    named = re.search(r"after migration (\d{4})_", SCHEMA.read_text())
    assert named is not None, "schema.sql does not say which migration it follows"
    assert int(named[1]) == last.version, (
        f"schema.sql is of migration {named[1]}, the last is {last.version:04d}_{last.name}.sql: run `make schema`"
    )


def test_the_snapshot_makes_the_schema_the_migrations_make(
    pg_server_url: str, template_db: str, from_snapshot: str
) -> None:
    migrated = catalog(with_dbname(pg_server_url, template_db))
    snapshot = catalog(from_snapshot)
    assert migrated["columns"], "the migrated schema has no columns: the catalog query reads nothing"
    for part, rows in migrated.items():
        missing = [row for row in rows if row not in snapshot[part]]
        extra = [row for row in snapshot[part] if row not in rows]
        assert (missing, extra) == ([], []), f"schema.sql differs from the migrations in {part}: run `make schema`"
