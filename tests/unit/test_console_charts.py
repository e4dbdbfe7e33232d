"""The console's SVG charts, as pure functions: where things are drawn and that labels are escaped."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from lowtide.console import charts, forecast
from lowtide.console.forms import BadInput, signal_value, task_id, text

NOW = 1_800_000_000.0


def _y_of(svg: str, css: str) -> float:
    found = re.search(rf'<line class="{css}" x1="[\d.]+" y1="([\d.]+)"', svg)
    assert found, svg
    return float(found.group(1))


def test_the_threshold_is_drawn_at_its_value_and_high_periods_are_shaded() -> None:
    history = [(NOW - 3600, 100.0), (NOW - 1800, 300.0), (NOW - 900, 100.0)]
    svg = charts.signal_chart(history=history, forecast=[], threshold=200.0, now=NOW, since=NOW - 48 * 3600)
    top = charts.signal_chart(history=history, forecast=[], threshold=280.0, now=NOW, since=NOW - 48 * 3600)
    # A higher threshold is drawn higher (smaller y); one shaded span, for the 15 minutes over 200.
    assert _y_of(top, "threshold-line") < _y_of(svg, "threshold-line")
    assert svg.count('<rect class="hold"') == 1
    assert 'class="signal-line"' in svg and 'class="forecast-line"' not in svg


def test_a_planned_release_is_drawn_ahead_of_now_with_its_task() -> None:
    forecast = [(NOW + 600 * i, v) for i, v in enumerate([300.0, 90.0, 300.0])]
    release = charts.Release(task_id=42, at=NOW + 600, intensity=90.0)
    svg = charts.signal_chart(
        history=[(NOW - 60, 300.0)], forecast=forecast, threshold=250.0, now=NOW, since=NOW - 3600, releases=[release]
    )
    marker = re.search(r'<g class="planned-release" data-task="42"><line x1="([\d.]+)"', svg)
    now_line = re.search(r'<line class="now" x1="([\d.]+)"', svg)
    assert marker and now_line and float(marker.group(1)) > float(now_line.group(1))
    assert 'class="forecast-line"' in svg


def test_labels_are_escaped() -> None:
    bar = charts.Bar(label='<script>alert("x")</script>', low=NOW, start=NOW + 60, high=NOW + 120)
    svg = charts.timeline([bar], NOW)
    assert "<script>" not in svg and "&lt;script&gt;" in svg


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: task_id("0"), "task id: must be a whole number"),
        (lambda: task_id("9" * 30), "task id: must be a whole number"),
        (lambda: text({"queue": "q" * 201}, "queue"), "queue: at most 200 characters"),
        (lambda: text({"queue": "a\x00b"}, "queue"), "queue: must not contain control characters"),
        (lambda: signal_value({"value": "nan"}), "value: a finite number"),
        (lambda: signal_value({"value": "1e12"}), "value: a finite number"),
        (lambda: signal_value({"value": "lots"}), "value: not a number"),
    ],
)
def test_inputs_out_of_bounds_are_refused_with_the_field_named(call: Callable[[], object], message: str) -> None:
    with pytest.raises(BadInput, match=f"^{re.escape(message)}"):
        call()


def test_inputs_within_bounds_are_taken() -> None:
    assert task_id("17") == 17 and signal_value({"value": " 215.5 "}) == 215.5


def _ticks(svg: str) -> list[str]:
    return re.findall(r'<text class="tick" x="[\d.]+" y="[\d.-]+" text-anchor="end">([^<]*)</text>', svg)


def _line_ys(svg: str) -> list[float]:
    found = re.search(r'<polyline class="signal-line" points="([^"]+)"', svg)
    assert found, svg
    return [float(pair.split(",")[1]) for pair in found.group(1).split()]


def test_one_absurd_value_in_the_history_leaves_the_chart_readable() -> None:
    """`lowtide signal set 1e308` once (before values had a range): the 48 h chart drew every
    other value flat on its axis, and its axis labels ran to 300 digits, clipped to `.213312`."""
    history = [(NOW - 48 * 3600 + 1800 * i, 150.0 + 100.0 * (i % 4)) for i in range(96)]
    history.insert(50, (NOW - 23 * 3600 + 60, 1e308))
    svg = charts.signal_chart(history=history, forecast=[], threshold=300.0, now=NOW, since=NOW - 48 * 3600)
    labels = _ticks(svg)[:5]
    assert len(labels) == 5 and all(len(label) <= 6 for label in labels), labels
    ys = _line_ys(svg)
    # The real values (150 to 450) span most of the chart's height; nothing is drawn past its frame.
    assert max(ys) - min(ys) > (charts.HEIGHT - charts.TOP - charts.BOTTOM) * 0.5
    assert all(charts.TOP <= y <= charts.HEIGHT - charts.BOTTOM for y in ys)
    assert "1 value(s) above the chart, up to 1e+308" in svg


def test_negative_prices_are_drawn_inside_the_chart_with_their_labels() -> None:
    history = [(NOW - 3600 * (10 - i), v) for i, v in enumerate([80.0, 40.0, -5.0, -120.0, -60.0, 20.0, 95.0])]
    svg = charts.signal_chart(
        history=history, forecast=[], threshold=60.0, now=NOW, since=NOW - 48 * 3600, unit="EUR/MWh"
    )
    ys = _line_ys(svg)
    assert all(charts.TOP <= y <= charts.HEIGHT - charts.BOTTOM for y in ys)
    assert float(_ticks(svg)[0].replace(",", "")) <= -120.0
    assert "off the chart" not in svg and "above the chart" not in svg and "below the chart" not in svg


def test_a_real_peak_stays_on_the_chart() -> None:
    """The axis leaves out only the absurd: a short real peak (a coal hour at 900 on a day at
    100) is drawn at its height, not cut."""
    history = [(NOW - 3600 * (48 - i), 900.0 if i == 30 else 100.0) for i in range(48)]
    svg = charts.signal_chart(history=history, forecast=[], threshold=250.0, now=NOW, since=NOW - 48 * 3600)
    assert "above the chart" not in svg
    assert float(_ticks(svg)[4].replace(",", "")) >= 900.0


def _bands(svg: str) -> list[tuple[float, float, float, float]]:
    """Each band box: x, y (top), width, height."""
    found = re.findall(r'<rect class="forecast-band" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg)
    return [(float(x), float(y), float(w), float(h)) for x, y, w, h in found]


def test_each_forecast_point_is_drawn_with_its_band_of_plus_minus_its_error() -> None:
    forecast = [(NOW + 1800 * i, 200.0) for i in range(4)]
    errors = [(0.05, "learned over 3.0 days"), (0.10, "learned over 3.0 days"), (0.20, "prior"), (None, "")]
    svg = charts.signal_chart(
        history=[(NOW - 3600, 200.0)], forecast=forecast, threshold=400.0, now=NOW, since=NOW - 3600, errors=errors
    )
    bands = _bands(svg)
    # One box per point that states an error, as tall as twice its error, around its value.
    assert len(bands) == 3
    assert bands[1][3] == pytest.approx(2 * bands[0][3], rel=0.05)
    assert bands[2][3] == pytest.approx(4 * bands[0][3], rel=0.05)
    assert [b[0] for b in bands] == sorted(b[0] for b in bands)
    assert "200 ± 40 (20%; prior)" in svg and "200 ± 10 (5%; learned over 3.0 days)" in svg


def test_the_forecast_is_drawn_as_issued_from_its_first_point_beside_the_values_that_came() -> None:
    # Issued two hours ago: its past half lies beside the history, not cut at now.
    forecast = [(NOW - 7200 + 1800 * i, 150.0) for i in range(8)]
    history = [(NOW - 7200 + 1800 * i, 150.0 + 10 * i) for i in range(4)]
    svg = charts.signal_chart(
        history=history, forecast=forecast, threshold=400.0, now=NOW, since=NOW - 4 * 3600, errors=[(0.1, "feed")] * 8
    )
    line = re.search(r'<polyline class="forecast-line" points="([\d.]+),', svg)
    now_line = re.search(r'<line class="now" x1="([\d.]+)"', svg)
    signal = re.search(r'<polyline class="signal-line" points="([\d.]+),', svg)
    assert line and now_line and signal
    assert float(line.group(1)) == float(signal.group(1)) < float(now_line.group(1))
    assert len(_bands(svg)) == 8


def test_the_note_says_how_sure_the_forecast_is_where_its_error_comes_from_and_how_it_did() -> None:
    points = [
        forecast.Point(NOW - 3600 + 1800 * i, 100.0, 0.05 * (i + 1), "learned over 2.5 days" if i < 3 else "prior")
        for i in range(6)
    ]
    history = [(NOW - 3600, 104.0), (NOW - 1800, 120.0), (NOW, 95.0)]
    lines = forecast.note(points, issued_at=NOW - 3600, source="recorded", history=history, now=NOW + 60)
    text = " ".join(lines)
    assert "issued at" in lines[0] and "by recorded" in lines[0]
    assert "±20% for the next value, ±30% at its end" in text
    assert "learned over 2.5 days of this feed's forecasts against the values that came for 3 point(s)" in text
    assert "the configured prior" in text
    # 104 (inside ±5 %), 120 (outside ±10 %), 95 (inside ±15 %): 6 % above on average.
    assert "3 value(s) came: on average 6% above it, 2 of 3 inside its band" in text
    biased = [forecast.Point(NOW + 1800, 100.0, 0.1, "learned over 9.0 days", -0.08)]
    assert "the values come 8% under such a forecast" in " ".join(
        forecast.note(biased, issued_at=NOW, source="uk-carbon-intensity", history=[], now=NOW)
    )
    assert forecast.note([], issued_at=None, source="", history=history, now=NOW) == [
        "No forecast: the signal's feed gives none (yet)."
    ]
