"""Named queries in .sql files: blocks by name, and fragments written once for several queries."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.db import load_queries
from lowtide.db.queries import parse_queries, positional

ROOT = Path(__file__).resolve().parents[2]

SQL = """
-- _columns --
-- What both queries return.
id, state

-- one --
-- The first.
SELECT {{_columns}} FROM t WHERE id = %(id)s

-- two --
-- The second.
UPDATE t SET state = 'x' RETURNING {{_columns}}
"""


def test_fragments_are_put_in_place_without_their_comments_and_are_no_queries() -> None:
    queries = parse_queries(SQL)
    assert set(queries) == {"one", "two"}
    assert queries["one"].endswith("SELECT id, state FROM t WHERE id = %(id)s")
    assert queries["two"].endswith("RETURNING id, state")


def test_a_query_is_kept_without_comment_lines_indentation_or_runs_of_blanks() -> None:
    # psycopg parses a statement once only when its text is at most 4 KB: what the server does
    # not need is not sent, nor parsed again.
    queries = parse_queries(
        "-- one --\n-- The first.\nSELECT id,   state\n    -- a note\n    FROM t  -- the table\n    WHERE id = %(id)s\n"
    )
    assert queries["one"] == "SELECT id, state\nFROM t -- the table\nWHERE id = %(id)s"


def test_an_unknown_fragment_or_a_name_used_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="no fragment '_rows'"):
        parse_queries("-- one --\n-- The first.\nSELECT {{_rows}}\n")
    with pytest.raises(ValueError, match="defined twice"):
        parse_queries("-- one --\nSELECT 1\n-- one --\nSELECT 2\n")


def test_the_files_of_a_package_share_their_fragments_and_no_name() -> None:
    # finished_among (waits.sql) uses _finished, which workers.sql defines.
    waits = load_queries("scheduler_service.sql", "waits.sql")
    assert set(waits) == {"finished_among", "notify_finished"}
    assert "{{" not in waits["finished_among"] and "'completed'" in waits["finished_among"]
    every = load_queries("scheduler_service.sql")
    assert waits.items() <= every.items()
    assert {"claim_tasks", "finish_attempts", "upsert_worker"} <= every.keys()


def test_no_query_file_is_over_400_lines() -> None:
    files = [p for package in ("scheduler_service", "signal_service") for p in (ROOT / package / "sql").glob("*.sql")]
    assert files
    assert [f"{p.relative_to(ROOT)}: {n}" for p in files if (n := len(p.read_text().splitlines())) > 400] == []


def test_the_statements_of_a_single_submit_and_its_finish_are_parsed_once() -> None:
    # psycopg remembers how it parsed a statement only when its text is at most 4 KB (its
    # MAX_CACHED_STATEMENT_LENGTH); the insert answering SubmitTask grew past it once unnoticed.
    every = load_queries("scheduler_service.sql")
    hot = ("insert_tasks", "insert_tasks_whole", "insert_tasks_handed", "finish_independent_attempts", "claim_pair")
    assert {name: len(every[name]) for name in hot if len(every[name]) > 4096} == {}


def test_a_fragment_may_use_another_but_not_itself() -> None:
    queries = parse_queries(
        "-- _cols --\nid, {{_more}}\n-- _more --\nstate\n-- one --\n-- The first.\nSELECT {{_cols}} FROM t\n"
    )
    assert queries["one"] == "SELECT id, state FROM t"
    with pytest.raises(ValueError, match="'_a' uses itself: _a -> _b -> _a"):
        parse_queries("-- _a --\n{{_b}}\n-- _b --\n{{_a}}\n-- one --\nSELECT {{_a}}\n")


def test_a_query_made_positional_numbers_each_name_once_in_order() -> None:
    query = positional("SELECT %(b)s::int, %(a)s::text WHERE x = %(b)s::int")
    assert query.text == "SELECT $1::int, $2::text WHERE x = $1::int"
    assert query.values({"a": "x", "b": 7, "unused": 0}) == [7, "x"]
    with pytest.raises(ValueError, match="only %\\(name\\)s placeholders"):
        positional("SELECT 'a%%' || %(a)s")
