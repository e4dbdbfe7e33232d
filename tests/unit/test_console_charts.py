"""The console's SVG charts, as pure functions: where things are drawn and that labels are escaped."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from lowtide.console import charts
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
