"""Where and when through the real services: two pools bound to two replayed grid signals, a
worker in each, and a deferrable task allowed in both. It runs in the pool whose grid is cleaner
within its window, by the plan, and `task explain` says so; when that pool's workers go away, the
task is planned around it and runs in the other pool before its latest start. Each task's carbon
is counted on the grid of the pool it ran in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lowtide.config import Config, CostConfig, PoolConfig, SignalConfig, SignalDefinition
from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import NO_AUTH, make_config
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
START = datetime(2020, 1, 1, tzinfo=UTC)
# Ten-minute rows played at 600x: a row a second. Great Britain's grid (eu-west) stays at 260;
# Germany's (eu-central) is dirtier but for a clean spell 9 to 23 rows in.
GB = [260] * 40
DE = [300] * 9 + [150] * 14 + [300] * 17


@dataclass
class Services:
    signal: SignalServer
    scheduler: Scheduler
    config: Config


def _trace(path: Path, values: list[int]) -> str:
    rows = [f"{(START + timedelta(minutes=10 * i)).strftime('%Y-%m-%d %H:%M:%S')},{v}" for i, v in enumerate(values)]
    path.write_text("Time,Carbon Intensity\n" + "\n".join(rows) + "\n")
    return str(path)


def _signals(tmp_path: Path) -> dict[str, SignalDefinition]:
    def replayed(name: str, values: list[int]) -> SignalDefinition:
        file = _trace(tmp_path / f"{name}.csv", values)
        return SignalDefinition(feed="replay", replay_file=file, replay_speed=600.0, replay_loop=False, threshold=250)

    return {"gb": replayed("gb", GB), "de": replayed("de", DE)}


@pytest.fixture
async def regions(database_url: str, tmp_path: Path) -> AsyncIterator[Services]:
    signals = _signals(tmp_path)
    # The type follows the default signal, set by no one: held, so only the plan releases it.
    cost = CostConfig(defer_threshold=250.0, deferrable_activities=("train",))
    signal_config = SignalConfig(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        replay_forecast_model="iid",
        replay_forecast_error=0.0,
        refresh=timedelta(milliseconds=200),
    )
    signal = await start_signal_service(
        Config(signal=signal_config, cost=cost, signals=signals, auth=NO_AUTH), database_url=database_url
    )
    pools = {"eu-west": PoolConfig(signal="gb"), "eu-central": PoolConfig(signal="de")}
    config = replace(make_config(signal_target=signal.target), cost=cost, signals=signals, pools=pools)
    scheduler = await start_scheduler(config, database_url=database_url)
    yield Services(signal, scheduler, config)
    await scheduler.stop(grace=0.5)
    await signal.stop(grace=0.5)


def _worker(scheduler: Scheduler, pool: str, ran: dict[str, str]) -> Worker:
    worker = Worker(target=scheduler.target, pool=pool, slots=1)

    @worker.activity("train")
    async def train(payload: bytes) -> bytes:
        ran[payload.decode()] = pool
        return payload

    @worker.activity("echo")
    async def echo(payload: bytes) -> bytes:
        ran[payload.decode()] = pool
        return payload

    return worker


async def _forecasts_known(services: Services) -> bool:
    by_signal = services.scheduler.dispatcher.holds.by_signal
    return all(by_signal[name].forecast is not None for name in ("gb", "de"))


async def _connected(services: Services, *pools: str) -> bool:
    return set(pools) <= {s.pool for s in services.scheduler.registry}


async def _submit(client: Client, name: str, latest: datetime) -> int:
    task = await client.submit(
        "train", name, pools=["eu-west", "eu-central"], latest_start=latest, estimated_duration=timedelta(seconds=1)
    )
    return task.id


async def test_a_task_runs_in_the_cleaner_pool_by_the_plan_and_around_a_pool_that_drops(regions: Services) -> None:
    await eventually(lambda: _forecasts_known(regions), within=20)
    ran: dict[str, str] = {}
    target = regions.scheduler.target
    async with Client(target) as client, _worker(regions.scheduler, "eu-west", ran):
        central = _worker(regions.scheduler, "eu-central", ran)
        await central.__aenter__()
        await eventually(lambda: _connected(regions, "eu-west", "eu-central"))
        # B is placed in eu-central, for its clean spell; then eu-central's only worker leaves.
        latest_b = datetime.now(UTC) + timedelta(seconds=25)
        b = await _submit(client, "b", latest_b)
        placed = await client.get(b)
        assert placed.planned_pool == "eu-central", placed.plan_reason
        await central.__aexit__(None, None, None)
        done_b = await client.wait(b, timeout=timedelta(seconds=30))
        assert done_b.state == COMPLETED and ran["b"] == "eu-west"
        # Planned around the pool that dropped, not left to its latest start.
        assert done_b.started_at.ToDatetime(tzinfo=UTC) < latest_b - timedelta(seconds=5)
        assert done_b.planned_pool == "eu-west"
        # Its carbon is counted on the grid it ran in.
        assert done_b.signal_at_dispatch == pytest.approx(260)

        # A, with both pools staffed, goes to eu-central's clean spell and runs there.
        async with _worker(regions.scheduler, "eu-central", ran):
            await eventually(lambda: _connected(regions, "eu-west", "eu-central"))
            a = await _submit(client, "a", datetime.now(UTC) + timedelta(seconds=20))
            task = await client.get(a)
            assert task.planned_pool == "eu-central" and task.planned_intensity == pytest.approx(150)
            explained = (await client.explain(a)).explanation
            assert "planned release in pool eu-central at" in explained
            assert "150 gCO2/kWh against 260 gCO2/kWh in eu-west now" in explained
            # The pool's planned releases, in the metrics and the status while it waits, beside
            # each pool's signal.
            await eventually(lambda: _planned_in(regions, "eu-central", 1))
            pools = {p.name: p for p in (await client.status()).pools}
            assert (pools["eu-central"].signal, pools["eu-central"].planned_releases) == ("de", 1)
            assert (pools["eu-west"].signal, pools["eu-west"].signal_value) == ("gb", 260)
            done_a = await client.wait(a, timeout=timedelta(seconds=30))
        assert done_a.state == COMPLETED and ran["a"] == "eu-central", done_a.plan_reason


async def _planned_in(services: Services, pool: str, count: int) -> bool:
    text = services.scheduler.metrics.metrics.text()
    return f'lowtide_pool_planned_releases{{pool="{pool}"}} {count:.1f}' in text


async def test_a_pool_whose_workers_are_at_another_replica_is_not_planned_around(
    regions: Services, database_url: str
) -> None:
    """The replica a task is submitted to sees only its own workers: eu-central's are at another
    replica, and the task is still placed in eu-central for its clean spell."""
    other = await start_scheduler(regions.config, database_url=database_url)
    try:
        await eventually(lambda: _forecasts_known(regions), within=20)
        ran: dict[str, str] = {}
        async with (
            Client(regions.scheduler.target) as client,
            _worker(regions.scheduler, "eu-west", ran),
            _worker(other, "eu-central", ran),
        ):
            await eventually(lambda: _pools_have_workers(client, "eu-west", "eu-central"))
            task = await client.get(await _submit(client, "c", datetime.now(UTC) + timedelta(seconds=20)))
            assert task.planned_pool == "eu-central", task.plan_reason
    finally:
        await other.stop(grace=0.5)


async def _pools_have_workers(client: Client, *names: str) -> bool:
    pools = {p.name: p.workers for p in (await client.status()).pools}
    return all(pools.get(name, 0) > 0 for name in names)


async def test_work_that_names_no_pool_counts_its_carbon_on_the_grid_it_ran_in(regions: Services) -> None:
    ran: dict[str, str] = {}
    async with Client(regions.scheduler.target) as client, _worker(regions.scheduler, "eu-west", ran):
        await eventually(lambda: _connected(regions, "eu-west"))
        await eventually(lambda: _value_known(regions, "gb"))
        done = await client.wait((await client.submit("echo", "plain")).id)
    assert done.state == COMPLETED and ran["plain"] == "eu-west"
    # Not the default signal's (never set here): eu-west's grid, as a claim records it.
    assert done.signal_at_dispatch == pytest.approx(260)


async def _value_known(services: Services, signal: str) -> bool:
    return services.scheduler.dispatcher.holds.by_signal[signal].value is not None


async def test_a_task_naming_pools_records_at_submission_the_signal_of_the_pools_it_may_run_in(
    regions: Services,
) -> None:
    """The default signal is set by no one here: a task naming pools records, as the signal at its
    submission, the cleanest of its pools' signals now (what running it at once there would have
    had), not the default signal's; work naming no pool still records the default signal's."""
    await eventually(lambda: _value_known(regions, "gb"))
    await eventually(lambda: _value_known(regions, "de"))
    latest = datetime.now(UTC) + timedelta(seconds=20)
    async with Client(regions.scheduler.target) as client:
        west = await client.submit("echo", "w", pools=["eu-west"])
        # Placed (deferrable, with a latest start), and stored by a submission with a key.
        placed = await client.submit(
            "train",
            "p",
            pools=["eu-west", "eu-central"],
            latest_start=latest,
            estimated_duration=timedelta(seconds=1),
            idempotency_key="placed",
        )
        plain = await client.submit("echo", "n")
        stored = {t.id: t for t in [await client.get(t.id) for t in (west, placed, plain)]}
    assert stored[west.id].signal_at_submit == pytest.approx(260)
    # Germany's grid is at 300 or in its clean spell at 150: the lower of the two pools' values.
    assert stored[placed.id].HasField("signal_at_submit")
    assert stored[placed.id].signal_at_submit in (pytest.approx(150), pytest.approx(260))
    assert not stored[plain.id].HasField("signal_at_submit")
