"""Every query in schedules.sql prepares against the migrated schema."""

from __future__ import annotations

import psycopg
import pytest

from lowtide.db import load_queries
from tests.integration.test_migrations import migrated_database, numbered

QUERIES = load_queries("scheduler_service.sql", "schedules.sql")

__all__ = ["migrated_database"]


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_every_schedule_query_prepares_against_the_migrated_schema(migrated_database: str, query: str) -> None:
    sql, _ = numbered(QUERIES[query])
    assert "%(" not in sql, f"{query}: a placeholder that is not %(name)s"
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        try:
            conn.execute(f"PREPARE q AS {sql}")
        except psycopg.Error as error:
            pytest.fail(f"query {query!r} does not fit the migrated schema: {error}")
        conn.execute("DEALLOCATE q")
