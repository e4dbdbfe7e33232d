"""The signal's pure rules: high, refused values, stale."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from lowtide.errors import InvalidArgument
from signal_service.domain import ValueRange, check_unit, is_high, is_stale, validate_value


def test_high_until_the_first_value_then_above_the_threshold() -> None:
    assert is_high(None, 400.0)
    assert is_high(400.1, 400.0)
    assert not is_high(400.0, 400.0)
    assert not is_high(-5.0, 0.0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_refused_in_any_unit(value: float) -> None:
    for unit in ("gCO2/kWh", "EUR/MWh"):
        with pytest.raises(InvalidArgument) as caught:
            validate_value(value, unit, field="readings[2].value")
        assert str(caught.value).startswith("readings[2].value:")


def test_negative_intensities_are_refused_negative_prices_are_not() -> None:
    for unit in ("gCO2/kWh", "percentile", "lbs/MWh"):
        with pytest.raises(InvalidArgument, match="cannot be negative"):
            validate_value(-0.5, unit)
    assert validate_value(-0.5, "EUR/MWh") == -0.5
    assert validate_value(0.0, "gCO2/kWh") == 0.0


@pytest.mark.parametrize(
    ("value", "unit", "message"),
    [
        (1e308, "gCO2/kWh", "value: is 1e+308, outside the plausible range of 0 to 2000 gCO2/kWh"),
        (2000.5, "gCO2/kWh", "outside the plausible range of 0 to 2000 gCO2/kWh"),
        (101.0, "percentile", "outside the plausible range of 0 to 100 percentile"),
        (-1500.0, "EUR/MWh", "outside the plausible range of -1000 to 10000 EUR/MWh"),
        (2e6, "points", "outside the plausible range of -1e+06 to 1e+06 points"),
    ],
)
def test_a_value_outside_its_unit_s_plausible_range_is_refused_naming_the_range(
    value: float, unit: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_value(value, unit)
    assert message in str(caught.value) and "(set [signals.NAME] min and max to change the range)" in str(caught.value)


def test_real_extremes_are_in_range_and_a_configured_range_replaces_the_unit_s() -> None:
    # A real coal-heavy hour, the day-ahead market's floor and its cap: all plausible.
    assert validate_value(1300.0, "gCO2/kWh") == 1300.0
    assert validate_value(-500.0, "EUR/MWh") == -500.0
    assert validate_value(4000.0, "EUR/MWh") == 4000.0
    narrow = ValueRange.of("gCO2/kWh", None, 900.0)
    with pytest.raises(InvalidArgument) as caught:
        validate_value(950.0, "gCO2/kWh", accepted=narrow, signal="grid")
    assert str(caught.value) == (
        "value: is 950, outside the plausible range of 0 to 900 gCO2/kWh of signal grid; a value there is refused "
        "as a typo or a broken feed (set [signals.grid] min and max to change the range)"
    )


def test_another_unit_is_refused_an_omitted_one_is_not() -> None:
    check_unit("", "gCO2/kWh")
    check_unit("gCO2/kWh", "gCO2/kWh")
    with pytest.raises(InvalidArgument) as caught:
        check_unit("percentile", "gCO2/kWh")
    assert caught.value.field == "unit"


def test_stale_after_no_update_for_stale_after() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    limit = timedelta(minutes=10)
    assert not is_stale(None, limit, now)
    assert not is_stale(now - limit, limit, now)
    assert is_stale(now - limit - timedelta(seconds=1), limit, now)
