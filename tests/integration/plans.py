"""How many rows of lowtide.tasks a statement reads, from its plan as PostgreSQL ran it
(EXPLAIN ANALYZE, in a transaction rolled back): what the tests of statements that must not read
the table (tens of thousands running, a large history) assert."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql


def task_rows_read(plan: dict[str, Any], relation: str = "tasks") -> int:
    """Rows the plan's scans of lowtide.tasks (or of another table of the schema) read, over all
    their loops: those they returned and those their filters dropped."""

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [n for n in nodes(plan["Plan"]) if n["Node Type"].endswith("Scan") and n.get("Relation Name") == relation]
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
    if not names:  # EXECUTE takes no parentheses for a statement without parameters
        return prepare, sql.SQL("EXECUTE {}").format(sql.Identifier(name))
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


def rows_read_planned_before_each(
    database_url: str,
    statements: Mapping[str, tuple[str, dict[str, Any], str | None]],
    setup: Sequence[str],
    backlog: Sequence[str],
) -> dict[str, int]:
    """rows_read_planned_before for many statements at once (one database, one backlog): each
    `name: (query, params, options)` prepared after `setup` on a connection of its `options`
    (those of the connections it runs on: plan_cache_mode, and whatever else they set), run once
    there (a first run that fails, say on a row the backlog has not inserted yet, has made its plan
    all the same), then explained once `backlog` has filled the tables. `options` None: a statement
    never prepared, planned when it runs (with the statistics `setup` left), as rows_read does."""
    executes: dict[str, tuple[str, sql.Composed]] = {}
    unprepared: dict[str, tuple[str, dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        conns: dict[str, psycopg.Connection[Any]] = {}
        for i, (name, (query, params, given)) in enumerate(statements.items()):
            options = "" if given is None else given
            if options not in conns:
                conns[options] = stack.enter_context(psycopg.connect(database_url, autocommit=True, options=options))
                if len(conns) == 1:
                    for statement in setup:
                        conns[options].execute(statement)
            if given is None:
                unprepared[name] = (query, params)
                continue
            conn = conns[options]
            prepare, execute = _prepared(query, params, f"planned_before_{i}")
            conn.execute(prepare)
            with contextlib.suppress(psycopg.Error), conn.transaction(force_rollback=True):
                conn.execute(execute)  # planned now
            executes[name] = (options, execute)
        first = next(iter(conns.values()))
        for statement in backlog:
            first.execute(statement)
        read = {name: _explained(conns[options], execute) for name, (options, execute) in executes.items()}
        return read | {name: rows_read(conns[""], query, params) for name, (query, params) in unprepared.items()}
