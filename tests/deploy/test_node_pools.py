"""A Node worker (clients/node) in a pool bound to a grid signal takes the task the plan placed in
its pool: two pools on two replayed grids, the Node worker in eu-central (whose grid has a clean
spell), a Python worker in eu-west (whose grid does not), and a deferrable task allowed in both."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lowtide.config import Config, CostConfig, PoolConfig, SignalConfig, SignalDefinition
from lowtide_client import Client, TaskState, Worker
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import start_signal_service
from tests.conftest import NO_AUTH, make_config
from tests.deploy.node import NODE_DIR, ensure_node_modules, node_or_skip
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
WORKER = Path(__file__).with_name("pool_worker.js")
START = datetime(2020, 1, 1, tzinfo=UTC)
# Ten-minute rows played at 600x, a row a second: Great Britain (eu-west) at 260 all along,
# Germany (eu-central) dirtier but for a clean spell 9 to 23 rows in.
GB = [260] * 40
DE = [300] * 9 + [150] * 14 + [300] * 17


def _signal(path: Path, values: list[int]) -> SignalDefinition:
    rows = [f"{(START + timedelta(minutes=10 * i)).strftime('%Y-%m-%d %H:%M:%S')},{v}" for i, v in enumerate(values)]
    path.write_text("Time,Carbon Intensity\n" + "\n".join(rows) + "\n")
    return SignalDefinition(feed="replay", replay_file=str(path), replay_speed=600.0, replay_loop=False, threshold=250)


@pytest.fixture
async def regions(database_url: str, tmp_path: Path) -> AsyncIterator[Scheduler]:
    signals = {"gb": _signal(tmp_path / "gb.csv", GB), "de": _signal(tmp_path / "de.csv", DE)}
    # `train` follows the default signal, set by no one: held, so only the plan releases it.
    cost = CostConfig(defer_threshold=250.0, deferrable_activities=("train",))
    listen = SignalConfig(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        replay_forecast_model="iid",
        replay_forecast_error=0.0,
        refresh=timedelta(milliseconds=200),
    )
    signal = await start_signal_service(
        Config(signal=listen, cost=cost, signals=signals, auth=NO_AUTH), database_url=database_url
    )
    pools = {"eu-west": PoolConfig(signal="gb"), "eu-central": PoolConfig(signal="de")}
    config = replace(make_config(signal_target=signal.target), cost=cost, signals=signals, pools=pools)
    running = await start_scheduler(config, database_url=database_url)
    yield running
    await running.stop(grace=0.5)
    await signal.stop(grace=0.5)


@contextlib.asynccontextmanager
async def _node_worker(node: str, target: str, pool: str, log: Path) -> AsyncIterator[None]:
    env = dict(os.environ, LOWTIDE_TARGET=target, WORKER_ID=f"node-{pool}", POOL=pool)
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            node, str(WORKER), cwd=NODE_DIR, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    try:
        yield
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def test_a_node_worker_in_a_pool_takes_the_task_placed_in_its_pool(regions: Scheduler, tmp_path: Path) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    holds = regions.dispatcher.holds.by_signal
    await eventually(lambda: _true(all(holds[name].forecast is not None for name in ("gb", "de"))), within=20)
    west = Worker(target=regions.target, pool="eu-west", slots=1)

    @west.activity("train")
    async def train(payload: bytes) -> bytes:
        return b"python eu-west: " + payload

    log = tmp_path / "node.log"
    async with (
        Client(regions.target) as client,
        west,
        _node_worker(node, regions.target, "eu-central", log),
    ):
        pools = {"eu-west", "eu-central"}
        await eventually(lambda: _true(pools <= {s.pool for s in regions.registry}), within=20)
        latest = datetime.now(UTC) + timedelta(seconds=20)
        task = await client.submit(
            "train", "a", pools=sorted(pools), latest_start=latest, estimated_duration=timedelta(seconds=1)
        )
        assert task.planned_pool == "eu-central", task.plan_reason
        done = await client.wait(task.id, timeout=timedelta(seconds=30))
    assert done.state == COMPLETED, (done, log.read_text())
    # Run by the Node worker of eu-central, by the plan: in the clean spell, before the latest start.
    assert (done.result, done.worker_id) == (b"node eu-central: a", "node-eu-central")
    assert done.planned_intensity == pytest.approx(150)
    # Counted on eu-central's grid (at the spell's first second, its value may not have come yet).
    assert done.signal_at_dispatch in (pytest.approx(150), pytest.approx(300))
    assert done.started_at.ToDatetime(tzinfo=UTC) < latest


async def _true(value: bool) -> bool:
    return value
