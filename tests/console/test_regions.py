"""Where and when on the overview, in a real browser against real services: two pools bound to two
replayed grid signals, a worker in each, and a deferrable task allowed in both, placed by the plan
in eu-central for its grid's clean spell. Each region shows its signal against its threshold, its
workers, and the held tasks planned to be released there with the next one's time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from lowtide_client import Client, Worker
from tests.console.conftest import Stack, start_stack
from tests.helpers import eventually

START = datetime(2020, 1, 1, tzinfo=UTC)
# Ten-minute rows played at 30x (20 s a row). Great Britain's grid (eu-west) stays at 260;
# Germany's (eu-central) is dirtier but for a clean spell from two minutes in, which the plan picks.
SPEED = 30
GB = [260] * 36
DE = [300] * 6 + [150] * 20 + [300] * 10


def _trace(path: Path, values: list[int]) -> str:
    rows = [f"{(START + timedelta(minutes=10 * i)).strftime('%Y-%m-%d %H:%M:%S')},{v}" for i, v in enumerate(values)]
    path.write_text("Time,Carbon Intensity\n" + "\n".join(rows) + "\n")
    return str(path)


def _regions(folder: Path) -> str:
    signals = "".join(
        f'[signals.{name}]\nfeed = "replay"\nreplay_file = "{_trace(folder / f"{name}.csv", values)}"\n'
        f'replay_speed = {SPEED}.0\nreplay_loop = false\nthreshold = 250.0\nrefresh = "1s"\n\n'
        for name, values in (("gb", GB), ("de", DE))
    )
    return signals + '[pools.eu-west]\nsignal = "gb"\n\n[pools.eu-central]\nsignal = "de"\n\n'


@pytest.fixture
def regions_stack(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    # The default signal is set by no one: `train` stays held, so only the plan releases it.
    feed = {
        "LOWTIDE_SIGNAL_FEED": "static",
        "LOWTIDE_SIGNAL_REPLAY_FORECAST_MODEL": "iid",
        "LOWTIDE_SIGNAL_REPLAY_FORECAST_ERROR": "0",
    }
    stack = start_stack(database_url, tmp_path, auth=False, feed=feed, config=_regions(tmp_path))
    yield stack
    stack.stop()


def _worker(stack: Stack, pool: str) -> Worker:
    worker = Worker(target=stack.scheduler, pool=pool, slots=1)

    @worker.activity("train")
    async def train(payload: bytes) -> bytes:
        return payload

    return worker


# Each region as the page shows it, read at one moment.
READ = """
return [...document.querySelectorAll('#regions article.region')].map(a => ({
  pool: a.dataset.pool,
  signal: a.querySelector('.region-signal').innerText,
  workers: a.querySelector('.region-workers').innerText,
  releases: a.querySelector('.region-releases').innerText,
  markers: [...a.querySelectorAll('g.planned-release')].map(g => g.dataset.task),
  drawn: !!a.querySelector('svg polyline.signal-line') && !!a.querySelector('svg line.threshold-line'),
}));
"""


async def test_each_region_shows_its_signal_and_the_releases_planned_there(
    browser: WebDriver, regions_stack: Stack, screenshots: Path
) -> None:
    async with (
        Client(regions_stack.scheduler) as client,
        _worker(regions_stack, "eu-west"),
        _worker(regions_stack, "eu-central"),
    ):

        async def staffed() -> bool:
            pools = {p.name: p for p in (await client.status()).pools}
            return all(pools[n].workers and pools[n].HasField("signal_value") for n in ("eu-west", "eu-central"))

        await eventually(staffed, within=30, interval=0.2)
        task = await client.submit(
            "train",
            "a",
            pools=["eu-west", "eu-central"],
            latest_start=datetime.now(UTC) + timedelta(minutes=5),
            estimated_duration=timedelta(seconds=20),
        )
        placed = await client.get(task.id)
        assert placed.planned_pool == "eu-central", placed.plan_reason
        at = placed.planned_release_at.ToDatetime(tzinfo=UTC).strftime("%H:%M:%S UTC")
        await asyncio.to_thread(browser.get, regions_stack.url + "/")

        async def shown() -> dict[str, dict[str, Any]]:
            regions = await asyncio.to_thread(browser.execute_script, READ)
            found = {r["pool"]: r for r in regions or []}
            central = found.get("eu-central")
            return found if central and central["markers"] and found.get("eu-west") else {}

        found = await eventually(shown, within=30, interval=0.25)
        west, central = found["eu-west"], found["eu-central"]
        # Each region's own signal, against its threshold.
        assert west["signal"] == "Signal gb: 260 gCO2/kWh, above its threshold of 250."
        assert central["signal"] == "Signal de: 300 gCO2/kWh, above its threshold of 250."
        assert west["workers"] == central["workers"] == "1 worker(s) connected, 0 of 1 slot(s) busy."
        # The planned release is eu-central's, with its time and the forecast then; not eu-west's.
        assert central["releases"] == (
            f"1 held task(s) planned to be released here: the next at {at} (task {task.id}, forecast 150)."
        )
        assert central["markers"] == [str(task.id)] and west["markers"] == []
        assert west["releases"] == "No held task is planned to be released here."
        assert west["drawn"] and central["drawn"]
        # A signal a region draws is not drawn again among the other signals; the price still is.
        others = await asyncio.to_thread(
            browser.execute_script,
            "return [...document.querySelectorAll('section.other-signal')].map(s => s.dataset.signal);",
        )
        assert others == ["price"]
        # The default signal's chart does not mark a release planned on de's forecast.
        default = await asyncio.to_thread(
            browser.execute_script,
            "return [document.querySelectorAll('#signal-chart g.planned-release').length,"
            " document.querySelector('#story').innerText];",
        )
        assert default[0] == 0
        assert "1 task(s) placed in a pool bound to another signal, released there as planned" in default[1]
        await _task_page_shows_the_pools_signal(browser, regions_stack, task.id)
        # The picture for the docs: the regions, from their heading.
        await asyncio.to_thread(browser.execute_script, "document.getElementById('regions').scrollIntoView();")
        await asyncio.to_thread(browser.save_screenshot, str(screenshots / "console-regions.png"))


TASK_READ = """
const chart = document.querySelector('#plan-chart svg');
const pool = document.querySelector('#planned-pool');
const on = document.querySelector('#plan-signal');
return {pool: pool ? pool.innerText : '', on: on ? on.innerText : '',
  markers: chart ? [...chart.querySelectorAll('g.planned-release')].map(g => g.dataset.task) : [],
  forecast: chart ? [...chart.querySelectorAll('rect.forecast-band')].map(r => parseFloat(r.dataset.value)) : []};
"""


async def _task_page_shows_the_pools_signal(browser: WebDriver, stack: Stack, task_id: int) -> None:
    """The task's page draws the forecast its plan came from: eu-central's signal's, not the
    default signal's (which has none here)."""
    await asyncio.to_thread(browser.get, f"{stack.url}/tasks/{task_id}")

    async def shown() -> dict[str, Any]:
        page: dict[str, Any] = await asyncio.to_thread(browser.execute_script, TASK_READ)
        return page if page["markers"] else {}

    page = await eventually(shown, within=20, interval=0.25)
    assert page["pool"] == "eu-central" and page["on"] == "signal de's forecast (below)"
    assert page["markers"] == [str(task_id)] and {150.0, 300.0} <= set(page["forecast"])
    await asyncio.to_thread(browser.get, stack.url + "/")
