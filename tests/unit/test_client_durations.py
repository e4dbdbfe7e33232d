"""Client durations: the accepted spellings, exact round trips, clear refusals, protobuf form."""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.protobuf import duration_pb2
from hypothesis import given
from hypothesis import strategies as st

from lowtide_client import format_duration, parse_duration
from lowtide_proto.durations import duration_from_proto, duration_to_proto


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("250ms", timedelta(milliseconds=250)),
        ("5s", timedelta(seconds=5)),
        ("1.5s", timedelta(seconds=1.5)),
        (".5s", timedelta(milliseconds=500)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("0.5d", timedelta(hours=12)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1m0.25s", timedelta(minutes=1, milliseconds=250)),
        ("15us", timedelta(microseconds=15)),
        (" 5s\n", timedelta(seconds=5)),
    ],
)
def test_parse_accepts_the_documented_spellings(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(microseconds=1500), "1500us"),
        (timedelta(seconds=5), "5s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(seconds=90), "90s"),
        (timedelta(minutes=10), "10m"),
        (timedelta(minutes=90), "90m"),
        (timedelta(hours=2), "2h"),
        (timedelta(days=2), "48h"),
        (timedelta(seconds=3600, microseconds=1), "3600.000001s"),
        (-timedelta(seconds=5), "-5s"),
    ],
)
def test_format_picks_the_shortest_exact_spelling(td: timedelta, text: str) -> None:
    assert format_duration(td) == text


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10_000)))
def test_format_then_parse_gives_back_the_same_duration(td: timedelta) -> None:
    assert parse_duration(format_duration(td)) == td


@pytest.mark.parametrize("text", ["250ms", "5s", "1.5s", "10m", "2h", "0s"])
def test_parse_then_format_gives_back_the_same_text(text: str) -> None:
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "expected a number followed by a unit"),
        ("5", "missing unit"),
        ("1.5", "missing unit"),
        ("-5s", "cannot be negative"),
        ("5 s", "expected a number followed by a unit"),
        ("5sec", "expected a number followed by a unit"),
        ("5S", "expected a number followed by a unit"),
        ("s", "expected a number followed by a unit"),
        ("1..5s", "expected a number followed by a unit"),
        ("9" * 30 + "h", "too large"),
    ],
)
def test_parse_refuses_anything_else_and_says_why(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)


def test_parse_refuses_a_non_string() -> None:
    with pytest.raises(TypeError):
        parse_duration(5)  # type: ignore[arg-type]


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10_000)))
def test_protobuf_round_trip_is_exact(td: timedelta) -> None:
    message = duration_to_proto(td)
    assert isinstance(message, duration_pb2.Duration)
    assert duration_from_proto(message) == td


def test_protobuf_form_splits_seconds_and_nanos() -> None:
    message = duration_to_proto(timedelta(seconds=1, milliseconds=250))
    assert (message.seconds, message.nanos) == (1, 250_000_000)
