"""Named queries in .sql files: blocks by name, and fragments written once for several queries."""

from __future__ import annotations

import pytest

from lowtide.db.queries import parse_queries

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


def test_an_unknown_fragment_or_a_name_used_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="no fragment '_rows'"):
        parse_queries("-- one --\n-- The first.\nSELECT {{_rows}}\n")
    with pytest.raises(ValueError, match="defined twice"):
        parse_queries("-- one --\nSELECT 1\n-- one --\nSELECT 2\n")
