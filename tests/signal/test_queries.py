"""Every named query of the signal service prepares against the migrated schema, so a renamed
column fails here rather than in production."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from lowtide.db import load_queries
from tests.conftest import with_dbname

QUERIES = load_queries("signal_service.sql")


def numbered(sql: str) -> str:
    """psycopg's `%(name)s` placeholders as PostgreSQL's `$n`, the same name the same number."""
    names: dict[str, int] = {}
    out = []
    rest = sql
    while "%(" in rest:
        before, _, after = rest.partition("%(")
        name, _, rest = after.partition(")s")
        out.append(f"{before}${names.setdefault(name, len(names) + 1)}")
    return "".join(out) + rest


@pytest.fixture(scope="module")
def migrated(pg_server_url: str, template_db: str) -> Iterator[str]:
    name = f"lowtide_sq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield with_dbname(pg_server_url, name)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_every_signal_query_prepares_against_the_migrated_schema(migrated: str, query: str) -> None:
    with psycopg.connect(migrated, autocommit=True) as conn:
        try:
            conn.execute(psycopg.sql.SQL("PREPARE q AS {}").format(psycopg.sql.SQL(numbered(QUERIES[query]))))
        except psycopg.Error as error:
            pytest.fail(f"query {query!r} does not fit the migrated schema: {error}")
        conn.execute("DEALLOCATE q")
