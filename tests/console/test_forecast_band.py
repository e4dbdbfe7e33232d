"""The overview's forecast on a recorded feed, in a real browser against real services: the forecast
drawn as it was issued beside the values as they come, each point with its band of ± its stated
error, and sentences that say how sure it is, where the error comes from, and how the values that
came compare with it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from lowtide_proto.lowtide.v1 import signal_pb2, signal_pb2_grpc
from tests.console.conftest import Stack, start_stack

T0 = datetime(2023, 3, 14, tzinfo=UTC)
# Twelve recorded hours: values rising through each three hours; a forecast issued at 00:00 (100
# for six hours, then 120) and one at 06:00 (125 for six hours).
ACTUALS = [100.0, 110.0, 120.0, 130.0, 140.0, 150.0] * 4
ISSUES = {0: [100.0] * 12 + [120.0] * 12, 12: [125.0] * 12}


def _recording(folder: Path) -> dict[str, str]:
    def at(half_hours: int) -> str:
        return f"{T0 + timedelta(minutes=30 * half_hours):%Y-%m-%dT%H:%MZ}"

    rows = [f"{at(start)},{at(start + i)},{v:g}" for start, values in ISSUES.items() for i, v in enumerate(values)]
    (folder / "forecasts.csv").write_text("issued_at,target,forecast\n" + "\n".join(rows) + "\n")
    lines = [f"{at(i)},{v:g}" for i, v in enumerate(ACTUALS)]
    (folder / "actuals.csv").write_text("target,actual\n" + "\n".join(lines) + "\n")
    return {
        "LOWTIDE_SIGNAL_FEED": "recorded",
        "LOWTIDE_SIGNAL_RECORDED_FORECASTS": str(folder / "forecasts.csv"),
        "LOWTIDE_SIGNAL_RECORDED_ACTUALS": str(folder / "actuals.csv"),
        # A recorded half hour a second: the second forecast is issued 6 s in, the lap ends at 12 s.
        "LOWTIDE_SIGNAL_REPLAY_SPEED": "1800",
    }


@pytest.fixture
def recorded_stack(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    stack = start_stack(database_url, tmp_path, auth=False, feed=_recording(tmp_path))
    yield stack
    stack.stop()


NOTE = "const note = document.getElementById('forecast-note'); return note ? note.innerText : '';"

# The band boxes, the forecast line's first x, the now line's x and the note, read at one moment.
READ = """
const svg = document.querySelector('#signal-chart svg');
if (!svg) return null;
const bands = [...svg.querySelectorAll('rect.forecast-band')].map(r => ({
  value: parseFloat(r.dataset.value), error: parseFloat(r.dataset.error),
  height: parseFloat(r.getAttribute('height')), title: r.textContent}));
const line = svg.querySelector('polyline.forecast-line');
const now = svg.querySelector('line.now');
const signal = svg.querySelector('polyline.signal-line');
return {bands: bands,
  first_x: line ? parseFloat(line.getAttribute('points').split(',')[0]) : null,
  now_x: now ? parseFloat(now.getAttribute('x1')) : null,
  signal: !!signal,
  note: document.querySelector('#forecast-note').innerText};
"""


def _stated(stack: Stack) -> dict[float, list[tuple[float, str]]]:
    """What GetForecast states now: each value's errors and sources."""
    with grpc.insecure_channel(stack.env["LOWTIDE_SIGNAL_LISTEN"]) as channel:
        response = signal_pb2_grpc.SignalServiceStub(channel).GetForecast(signal_pb2.GetForecastRequest(), timeout=10)
    stated: dict[float, list[tuple[float, str]]] = {}
    for p in response.points:
        stated.setdefault(p.value, []).append((p.expected_error, p.error_source))
    return stated


def test_the_recorded_forecast_is_drawn_as_issued_with_its_band_beside_the_values_as_they_come(
    browser: WebDriver, recorded_stack: Stack, screenshots: Path
) -> None:
    browser.get(recorded_stack.url + "/")
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 40
    # Over a lap and more, each live refresh as the page shows it.
    while time.monotonic() < deadline and len({_issued(s["note"]) for s in seen if _issued(s["note"])}) < 3:
        shown = browser.execute_script(READ)
        if shown and shown["bands"]:
            seen.append(shown)
        time.sleep(0.25)
    assert seen, "no forecast band was drawn"

    # Every point of the forecast states an error, drawn as a box of ± that error around its value:
    # the box's height is the same multiple of value x error at every point.
    for shown in seen:
        scale = [b["height"] / (2 * b["value"] * b["error"]) for b in shown["bands"] if b["error"] > 0]
        assert scale and max(scale) - min(scale) <= 0.02 * max(scale) + 0.6, shown["bands"]
    # Those errors are the ones the signal service states (GetForecast), with their source.
    stated = _stated(recorded_stack)
    last = seen[-1]
    for band in last["bands"]:
        if band["value"] in stated:
            assert any(abs(band["error"] - e) <= 1e-5 * max(e, 1) for e, _ in stated[band["value"]]), band
    sources = {source for errors in stated.values() for _, source in errors}
    assert sources == {"prior"}  # a minute-old record teaches nothing yet
    assert "the configured prior" in last["note"] and "How sure: ±" in last["note"]

    # As issued: once its issue time is past, the forecast's line starts left of now, beside the
    # values that came; the values that came since its issue grow in number under the same issue.
    assert any(s["first_x"] is not None and s["first_x"] < s["now_x"] - 5 and s["signal"] for s in seen)
    came: dict[str, set[int]] = {}
    for s in seen:
        found = re.search(r"Since it was issued, (\d+) value\(s\) came", s["note"])
        if found and _issued(s["note"]):
            came.setdefault(_issued(s["note"]), set()).add(int(found.group(1)))
    assert any(len(counts) >= 3 for counts in came.values()), came
    # The first forecast is 100 while the values rise from 100 to 150: they come above it.
    assert any("above it" in s["note"] for s in seen if {b["value"] for b in s["bands"]} >= {100.0})
    # And each recorded forecast in turn: the one of 06:00 (125) follows the one of 00:00.
    values = [frozenset(b["value"] for b in s["bands"]) for s in seen]
    assert frozenset({125.0}) in values and any(100.0 in v for v in values)
    # The picture for the docs: a forecast with some of the values that came beside it.
    # (The note is read in the page, at one moment: the live refresh replaces the element.)
    WebDriverWait(browser, 20, poll_frequency=0.05).until(
        lambda b: re.search(r"Since it was issued, [3-5] value", b.execute_script(NOTE))
    )
    browser.save_screenshot(str(screenshots / "console-forecast-band.png"))


def _issued(note: str) -> str:
    found = re.search(r"Forecast issued at (\d\d:\d\d:\d\d UTC)", note)
    return found.group(1) if found else ""
