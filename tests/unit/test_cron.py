"""Cron expressions and their next fire time, daylight saving time included. No I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_service.domain.cron import next_fire, parse

LONDON = ZoneInfo("Europe/London")
NEW_YORK = ZoneInfo("America/New_York")


def fires(expr: str, after: datetime, tz: ZoneInfo, count: int) -> list[str]:
    """The next `count` fire times as local ISO strings with their offset."""
    out = []
    for _ in range(count):
        after = next_fire(expr, after, tz)
        out.append(after.astimezone(tz).isoformat())
    return out


def test_lists_ranges_steps_and_names() -> None:
    cron = parse("0,15-17,*/20 9-17/4 * JAN-MAR,dec MON-FRI")
    assert cron.minutes == (0, 15, 16, 17, 20, 40)
    assert cron.hours == (9, 13, 17)
    assert cron.months == frozenset({1, 2, 3, 12})
    assert cron.weekdays == frozenset({1, 2, 3, 4, 5})
    assert parse("0 0 * * 7").weekdays == parse("0 0 * * SUN").weekdays == frozenset({0})
    # a/n runs from a to the end of the field.
    assert parse("5/20 * * * *").minutes == (5, 25, 45)


def test_every_five_minutes_in_utc() -> None:
    after = datetime(2026, 6, 1, 12, 2, 30, tzinfo=UTC)
    assert fires("*/5 * * * *", after, ZoneInfo("UTC"), 3) == [
        "2026-06-01T12:05:00+00:00",
        "2026-06-01T12:10:00+00:00",
        "2026-06-01T12:15:00+00:00",
    ]
    # Strictly after: a fire time is never returned for itself.
    assert next_fire("*/5 * * * *", datetime(2026, 6, 1, 12, 5, tzinfo=UTC), ZoneInfo("UTC")) == datetime(
        2026, 6, 1, 12, 10, tzinfo=UTC
    )


def test_weekdays_at_nine_in_london_follow_local_time() -> None:
    # Friday 27 November 2026, after nine: next is Monday, in GMT; in summer nine is 08:00 UTC.
    assert fires("0 9 * * MON-FRI", datetime(2026, 11, 27, 12, tzinfo=UTC), LONDON, 2) == [
        "2026-11-30T09:00:00+00:00",
        "2026-12-01T09:00:00+00:00",
    ]
    assert next_fire("0 9 * * MON-FRI", datetime(2026, 6, 1, tzinfo=UTC), LONDON) == datetime(2026, 6, 1, 8, tzinfo=UTC)


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    # As in Vixie cron: the 13th, and every Friday.
    assert fires("0 0 13 * FRI", datetime(2026, 2, 1, tzinfo=UTC), ZoneInfo("UTC"), 4) == [
        "2026-02-06T00:00:00+00:00",
        "2026-02-13T00:00:00+00:00",
        "2026-02-20T00:00:00+00:00",
        "2026-02-27T00:00:00+00:00",
    ]


def test_leap_day() -> None:
    assert fires("0 0 29 2 *", datetime(2026, 3, 1, tzinfo=UTC), ZoneInfo("UTC"), 2) == [
        "2028-02-29T00:00:00+00:00",
        "2032-02-29T00:00:00+00:00",
    ]


def test_spring_forward_a_daily_job_still_runs_that_day() -> None:
    # 29 March 2026: London's clocks go from 01:00 GMT to 02:00 BST; 01:30 does not exist that
    # day, so the job runs as much later as the clocks jumped, then at 01:30 BST again.
    assert fires("30 1 * * *", datetime(2026, 3, 28, 12, tzinfo=UTC), LONDON, 3) == [
        "2026-03-29T02:30:00+01:00",
        "2026-03-30T01:30:00+01:00",
        "2026-03-31T01:30:00+01:00",
    ]


def test_spring_forward_an_interval_goes_on_in_real_time() -> None:
    # Every 20 minutes: 00:40 GMT is followed 20 real minutes later by 02:00 BST.
    assert fires("*/20 * * * *", datetime(2026, 3, 29, 0, 30, tzinfo=UTC), LONDON, 3) == [
        "2026-03-29T00:40:00+00:00",
        "2026-03-29T02:00:00+01:00",
        "2026-03-29T02:20:00+01:00",
    ]


def test_fall_back_a_daily_job_runs_once() -> None:
    # 25 October 2026: 01:00-02:00 happens twice in London; 01:30 fires on the first pass only.
    assert fires("30 1 * * *", datetime(2026, 10, 24, 12, tzinfo=UTC), LONDON, 2) == [
        "2026-10-25T01:30:00+01:00",
        "2026-10-26T01:30:00+00:00",
    ]


def test_fall_back_an_hourly_job_runs_every_real_hour() -> None:
    got = [next_fire("30 * * * *", datetime(2026, 10, 25, 0, 0, tzinfo=UTC), LONDON)]
    for _ in range(2):
        got.append(next_fire("30 * * * *", got[-1], LONDON))
    assert [t.astimezone(UTC).strftime("%H:%M") for t in got] == ["00:30", "01:30", "02:30"]
    assert [t.astimezone(LONDON).strftime("%H:%M%z") for t in got] == ["01:30+0100", "01:30+0000", "02:30+0000"]


def test_new_york_spring_forward() -> None:
    # 8 March 2026: 02:00 EST becomes 03:00 EDT.
    assert fires("30 2 * * *", datetime(2026, 3, 7, 12, tzinfo=UTC), NEW_YORK, 2) == [
        "2026-03-08T03:30:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", "cron: expected 5 fields (minute hour day-of-month month day-of-week), got 4"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("* 24 * * *", "hour: 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month: 0 is out of range 1-31"),
        ("* * * 13 *", "month: 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week: 8 is out of range 0-7"),
        ("* * * FOO *", "month: 'FOO' is not a number or a name"),
        ("*/0 * * * *", "minute: step '0' must be a positive number"),
        ("* 5-1 * * *", "hour: range '5-1' runs backwards"),
        ("1,,2 * * * *", "minute: empty item"),
        ("0 0 31 2,4 *", "day-of-month: '31' never occurs in month '2,4'"),
    ],
)
def test_bad_expressions_name_the_field(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse(expr)


def test_after_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire("* * * * *", datetime(2026, 1, 1), LONDON)


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    step = st.integers(1, high - low + 1)
    return st.one_of(
        st.just("*"),
        step.map(lambda n: f"*/{n}"),
        number.map(str),
        st.tuples(number, number).map(lambda p: f"{min(p)}-{max(p)}"),
        st.tuples(number, number, step).map(lambda p: f"{min(p[:2])}-{max(p[:2])}/{p[2]}"),
        st.lists(number, min_size=2, max_size=4).map(lambda ns: ",".join(map(str, ns))),
    )


def _expression(hour: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    # Day-of-month up to 28 keeps every generated expression possible in every month.
    fields = st.tuples(_field(0, 59), hour, _field(1, 28), _field(1, 12), _field(0, 7))
    return fields.map(" ".join)


MOMENTS = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC))
# Checked minute by minute up to this far past `after`; beyond it only the result itself is.
WALK = timedelta(days=2)


def _walk_checks(expr: str, after: datetime, tz: ZoneInfo) -> None:
    cron = parse(expr)
    fired = next_fire(expr, after, tz)
    assert fired > after
    assert cron.matches(fired.astimezone(tz).replace(tzinfo=None))
    minute = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while minute < min(fired, after + WALK):
        local = minute.astimezone(tz).replace(tzinfo=None)
        assert not cron.matches(local), f"{expr!r} skipped {minute.isoformat()} ({local} local)"
        minute += timedelta(minutes=1)


@settings(max_examples=150, deadline=None)
@given(
    expr=_expression(_field(0, 23)),
    after=MOMENTS,
    tz=st.sampled_from([ZoneInfo("UTC"), ZoneInfo("Asia/Kolkata"), ZoneInfo("Asia/Tokyo")]),
)
def test_next_fire_is_after_matches_and_skips_nothing(expr: str, after: datetime, tz: ZoneInfo) -> None:
    _walk_checks(expr, after, tz)


@settings(max_examples=100, deadline=None)
@given(
    expr=_expression(st.sampled_from(["*", "*/2", "*/3"])),
    after=MOMENTS,
    tz=st.sampled_from([LONDON, NEW_YORK, ZoneInfo("Australia/Lord_Howe")]),
)
def test_with_daylight_saving_an_interval_fires_at_every_matching_instant(
    expr: str, after: datetime, tz: ZoneInfo
) -> None:
    # An hour field starting with * makes a schedule an interval: it fires at every real instant
    # whose local wall time matches, on both passes of a repeated hour, and skips skipped ones.
    _walk_checks(expr, after, tz)


@settings(max_examples=100, deadline=None)
@given(expr=_expression(_field(0, 23)), after=MOMENTS, tz=st.sampled_from([LONDON, NEW_YORK]))
def test_with_daylight_saving_fire_times_only_move_forward(expr: str, after: datetime, tz: ZoneInfo) -> None:
    first = next_fire(expr, after, tz)
    second = next_fire(expr, first, tz)
    assert after < first < second
