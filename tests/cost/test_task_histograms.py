"""The task histograms on the scheduler's /metrics, through a real signal service, scheduler and
worker process: queue wait, run time, dispatch latency, time held by a cost hold, the signal at
dispatch, the finished counter's labels, the label cap, and the dashboard's queries."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from lowtide_client import Client, TaskState, Worker, task_spec
from scheduler_service.server import start_scheduler
from tests.conftest import make_config
from tests.cost.conftest import Pair
from tests.helpers import eventually, worker_process

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "lowtide.json"
METRICS = REPO / "docs" / "reference" / "metrics.md"
WAIT = "lowtide_task_queue_wait_duration_seconds"
RUN = "lowtide_task_run_duration_seconds"
DISPATCH = "lowtide_task_dispatch_duration_seconds"
HELD = "lowtide_task_held_duration_seconds"
SIGNAL = "lowtide_task_dispatch_signal"


def scrape(port: int | None) -> list[Sample]:
    assert port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def series(samples: Iterable[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name and labels.items() <= s.labels.items()]


def histogram(samples: list[Sample], name: str, **labels: str) -> tuple[dict[float, float], float, float]:
    """One labelled histogram's cumulative buckets (by upper bound), sum and count."""
    buckets = {float(s.labels["le"]): s.value for s in series(samples, f"{name}_bucket", **labels)}
    [total] = series(samples, f"{name}_sum", **labels)
    [count] = series(samples, f"{name}_count", **labels)
    return buckets, total.value, count.value


def above(buckets: dict[float, float], bound: float) -> float:
    """How many observations exceed `bound` (a bucket boundary)."""
    return buckets[float("inf")] - buckets[bound]


async def test_each_histogram_has_points_with_their_labels_and_plausible_values(pair: Pair) -> None:
    port = pair.scheduler.metrics.metrics.port
    worker = worker_process(pair.scheduler.target, "--types", "sleep,train,echo")
    try:
        async with Client(pair.scheduler.target) as client:
            await pair.set_signal(520)
            held = await client.submit("train", b"0")

            async def held_long_enough() -> bool:
                ages = series(await asyncio.to_thread(scrape, port), "lowtide_queue_oldest_held_age_seconds")
                return any(s.value >= 1.2 for s in ages if s.labels["queue"] == "default")

            await eventually(held_long_enough)
            napped = await client.submit("sleep", b"0.3")
            assert (await client.wait(napped.id, timeout=timedelta(seconds=30))).state == COMPLETED
            fixed = task_spec("echo", start_in=timedelta(milliseconds=300), estimated_duration=timedelta(seconds=1))
            [on_time] = await client.submit_many([fixed])
            assert (await client.wait(on_time.id, timeout=timedelta(seconds=30))).state == COMPLETED
            await pair.set_signal(120)
            assert (await client.wait(held.id, timeout=timedelta(seconds=30))).state == COMPLETED
    finally:
        worker.terminate()
        # Off the event loop: the scheduler runs on it, and the stopping worker awaits its answer.
        await asyncio.to_thread(worker.wait, 30)
    samples = await asyncio.to_thread(scrape, port)

    # The 0.3 s sleep ran at least 0.3 s: nothing at or under the 0.25 s bound.
    buckets, total, count = histogram(samples, RUN, queue="default", activity_type="sleep")
    assert count == 1 and total >= 0.3 and above(buckets, 0.25) == 1
    # Held at least 1.2 s by the cost hold (the held-age gauge said so before the fall): in the
    # time-held histogram above 1 s, and in its queue wait too (it was due all along).
    buckets, total, count = histogram(samples, HELD, queue="default", activity_type="train", reason="cost_hold")
    assert count == 1 and total >= 1.2 and above(buckets, 1) == 1
    buckets, total, count = histogram(samples, WAIT, queue="default", activity_type="train")
    assert count == 1 and above(buckets, 1) == 1
    # Work no hold held has no time held.
    assert not series(samples, f"{HELD}_count", activity_type="sleep")
    assert not series(samples, f"{HELD}_count", activity_type="echo")
    for activity_type in ("sleep", "train", "echo"):
        assert histogram(samples, WAIT, queue="default", activity_type=activity_type)[2] == 1
        assert histogram(samples, DISPATCH, queue="default", activity_type=activity_type)[2] == 1
        finished = series(
            samples, "lowtide_task_finished_total", queue="default", activity_type=activity_type, state="completed"
        )
        assert [s.value for s in finished] == [1]
    # The signal at dispatch, in its unit: 520 for the sleep, 120 for the released train.
    unit = {"signal": "grid", "unit": "gCO2/kWh"}
    buckets, total, count = histogram(samples, SIGNAL, queue="default", activity_type="sleep", **unit)
    assert (count, total, above(buckets, 500), above(buckets, 600)) == (1, 520, 1, 0)
    buckets, total, count = histogram(samples, SIGNAL, queue="default", activity_type="train", **unit)
    assert (count, total, above(buckets, 100), above(buckets, 125)) == (1, 120, 1, 0)

    # Every metric the dashboard queries is on one of the two endpoints (the pool figures after
    # their next refresh).
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\blowtide_[a-z0-9_]+\b", target["expr"])
    }
    assert {f"{HELD}_bucket", f"{WAIT}_bucket", f"{RUN}_bucket", f"{DISPATCH}_bucket"} <= queried

    async def missing() -> set[str]:
        exported: set[str] = set()
        for endpoint in (port, pair.signal.metrics.port):
            exported |= {s.name for s in await asyncio.to_thread(scrape, endpoint)}
        return queried - exported

    async def all_exported() -> bool:
        return not await missing()

    try:
        await eventually(all_exported)
    except AssertionError:
        raise AssertionError(f"the dashboard queries metrics nobody exports: {sorted(await missing())}") from None
    # And the metrics table of the docs' reference names every metric exported.
    table = set(re.findall(r"^\| `(lowtide_[a-z0-9_]+)", METRICS.read_text(), re.M))
    for endpoint in (port, pair.signal.metrics.port):
        assert await asyncio.to_thread(families, endpoint) <= table


def families(port: int | None) -> set[str]:
    """The metric names a scrape shows, as a reader writes them (counters with `_total`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    names = {f.name + ("_total" if f.type == "counter" else "") for f in text_string_to_metric_families(text)}
    return {name for name in names if name.startswith("lowtide_")}


async def test_activity_type_labels_are_capped_and_the_rest_count_as_other(database_url: str) -> None:
    scheduler = await start_scheduler(make_config(metrics_label_values=10), database_url=database_url)
    types = [f"kind-{n:02}" for n in range(50)]
    worker = Worker(target=scheduler.target, slots=8)
    for name in types:
        worker.register(name, lambda payload: payload)
    try:
        async with Client(scheduler.target) as client, worker:
            submitted = await client.submit_many([task_spec(name) for name in types])
            for task in submitted:
                assert (await client.wait(task.id, timeout=timedelta(seconds=30))).state == COMPLETED
        samples = await asyncio.to_thread(scrape, scheduler.metrics.metrics.port)
    finally:
        await scheduler.stop(grace=0.5)
    for name in (f"{WAIT}_count", f"{RUN}_count", f"{DISPATCH}_count", "lowtide_task_finished_total"):
        counts = {s.labels["activity_type"]: s.value for s in series(samples, name)}
        assert len(counts) == 11 and set(counts) - {"other"} <= set(types), name
        assert counts["other"] == 40 and sum(counts.values()) == 50, name
