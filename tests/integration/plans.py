"""How many rows of lowtide.tasks a statement reads, from its plan as PostgreSQL ran it
(EXPLAIN ANALYZE, in a transaction rolled back): what the tests of statements that must not read
the table (tens of thousands running, a large history) assert."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
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


def generic_rows_read(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> int:
    """What rows_read counts, under the plan PostgreSQL makes for any values: the one a statement
    psycopg prepared (after five runs on a connection) may keep."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", query)
    values = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(sql.SQL("PREPARE generic AS {}").format(sql.SQL(text)))
        try:
            explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE generic({})").format(values)
            (plan,) = conn.execute(explain).fetchone()  # type: ignore[misc]
        finally:
            conn.execute("DEALLOCATE generic")
    return task_rows_read((json.loads(plan) if isinstance(plan, str) else plan)[0])
