"""How many rows of lowtide.tasks a statement reads, from its plan as PostgreSQL ran it
(EXPLAIN ANALYZE, in a transaction rolled back): what the tests of statements that must not read
the table (tens of thousands running, a large history) assert."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql


def task_rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of lowtide.tasks read, over all their loops: those they returned and
    those their filters dropped."""

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [n for n in nodes(plan["Plan"]) if n["Node Type"].endswith("Scan") and n.get("Relation Name") == "tasks"]
    read = ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Index Recheck")
    return sum(int(sum(n.get(key, 0) for key in read) * n["Actual Loops"]) for n in scans)


def rows_read(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> int:
    with conn.transaction(force_rollback=True):
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()  # type: ignore[misc]
    return task_rows_read((json.loads(plan) if isinstance(plan, str) else plan)[0])


def _prepared(query: str, params: dict[str, Any], name: str) -> tuple[sql.Composed, sql.Composed]:
    """PREPARE and EXECUTE statements for a query written with psycopg's named placeholders."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", query)
    values = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
    prepare = sql.SQL("PREPARE {} AS {}").format(sql.Identifier(name), sql.SQL(text))
    return prepare, sql.SQL("EXECUTE {}({})").format(sql.Identifier(name), values)


def _explained(conn: psycopg.Connection[Any], execute: sql.Composed) -> int:
    with conn.transaction(force_rollback=True):
        (plan,) = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(execute)).fetchone()  # type: ignore[misc]
    return task_rows_read((json.loads(plan) if isinstance(plan, str) else plan)[0])


def generic_rows_read(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> int:
    """What rows_read counts, under the plan PostgreSQL makes for any values: the one a statement
    psycopg prepared (after five runs on a connection) may keep."""
    prepare, execute = _prepared(query, params, "generic")
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(prepare)
        try:
            return _explained(conn, execute)
        finally:
            conn.execute("DEALLOCATE generic")


def rows_read_planned_before(
    database_url: str, query: str, params: dict[str, Any], setup: Sequence[str], backlog: Sequence[str]
) -> int:
    """What rows_read counts under the generic plan PostgreSQL made when the statement first ran
    after `setup` (as a planned connection keeps it, lowtide.db.connector), once `backlog` has
    filled the table: a plan made on an all but empty table, run on a full one."""
    prepare, execute = _prepared(query, params, "planned_before")
    with psycopg.connect(database_url, autocommit=True, options="-c plan_cache_mode=force_generic_plan") as conn:
        for statement in setup:
            conn.execute(statement)
        conn.execute(prepare)
        with conn.transaction(force_rollback=True):
            conn.execute(execute)  # planned now
        for statement in backlog:
            conn.execute(statement)
        return _explained(conn, execute)
