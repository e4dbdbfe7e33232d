"""Rows into typed values at the store's edge: psycopg's class_row fills a frozen dataclass from
the query's columns, and a query whose columns do not match its class fails at once (a statement
run on its own has committed by then: CommittedUnread, from the TypeError naming the column)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from typing import NamedTuple

import psycopg
import pytest

from lowtide.db import CommittedUnread, Database
from lowtide.db.queries import positional


@dataclass(frozen=True, slots=True)
class Pair:
    id: int
    name: str


async def test_rows_become_frozen_values_and_a_mismatch_fails_at_once(database_url: str) -> None:
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        rows = await db.fetch_as(Pair, "SELECT g AS id, 'n' || g AS name FROM generate_series(1, 3) g")
        assert rows == [Pair(1, "n1"), Pair(2, "n2"), Pair(3, "n3")]
        with pytest.raises(FrozenInstanceError):
            rows[0].id = 9  # type: ignore[misc]
        assert await db.fetch_one_as(Pair, "SELECT 1 AS id, 'x' AS name WHERE false") is None
        async with db.transaction() as tx:
            assert await tx.fetch_one_as(Pair, "SELECT 7 AS id, 'seven' AS name") == Pair(7, "seven")
        with pytest.raises(CommittedUnread, match=r"TypeError.*extra"):
            await db.fetch_as(Pair, "SELECT 1 AS id, 'x' AS name, 2 AS extra")
        with pytest.raises(CommittedUnread, match=r"TypeError.*name"):
            await db.fetch_as(Pair, "SELECT 1 AS id")
        # A statement the server refuses did not commit: its own error, which may be tried again.
        with pytest.raises(psycopg.errors.DivisionByZero):
            await db.fetch_as(Pair, "SELECT 1 / 0 AS id, 'x' AS name")
    finally:
        await db.close()


class Ref(NamedTuple):
    """A hot-path row (a claimed or finished attempt) is a typed NamedTuple, filled positionally."""

    id: int
    attempt: int


async def test_named_tuple_rows_are_filled_in_order_and_a_mismatch_fails_at_once(database_url: str) -> None:
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        rows = await db.fetch_as(Ref, "SELECT g AS id, g * 10 AS attempt FROM generate_series(1, 2) g")
        assert rows == [Ref(1, 10), Ref(2, 20)]
        assert isinstance(rows[0], Ref) and rows[0].attempt == 10
        with pytest.raises(AttributeError):
            rows[0].id = 9  # type: ignore[misc]
        # Positional filling would swap these silently; the names are checked against the fields.
        with pytest.raises(CommittedUnread, match=r"TypeError.*attempt"):
            await db.fetch_as(Ref, "SELECT 10 AS attempt, 1 AS id")
        with pytest.raises(CommittedUnread, match=r"TypeError.*extra"):
            await db.fetch_as(Ref, "SELECT 1 AS id, 2 AS attempt, 3 AS extra")
    finally:
        await db.close()


async def test_a_statement_s_rows_with_a_last_column_apart_are_filled_by_name_in_any_order(database_url: str) -> None:
    """fetch_positional (the group insert's way): every column but the last makes the row class,
    filled as the values come when the columns are its fields in order, by name otherwise."""
    db = Database(database_url, min_size=1, max_size=2)
    await db.open()
    try:
        in_order = positional("SELECT %(id)s::int AS id, 'x' AS name, 5 AS extra")
        assert await db.fetch_positional(Pair, in_order, {"id": 1}) == [(Pair(1, "x"), 5)]
        swapped = positional("SELECT 'y' AS name, %(id)s::int AS id, 6 AS extra")
        assert await db.fetch_positional(Pair, swapped, {"id": 2}) == [(Pair(2, "y"), 6)]
        with pytest.raises(CommittedUnread, match="extra"):
            await db.fetch_positional(Pair, positional("SELECT 1 AS id, 2 AS extra, 'z' AS name"), {})
    finally:
        await db.close()
