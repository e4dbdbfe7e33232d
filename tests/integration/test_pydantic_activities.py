"""pydantic models as typed activity parameters and results, against a real scheduler: a model
(nested, with a datetime and a constrained field) goes out as JSON with its content type and comes
back as the activity's return model; a payload the model refuses fails the task naming the field;
and `client.submit(fn, Model(...))` is checked by mypy against the activity's parameter."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from lowtide_client import Client, Worker
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.server import Scheduler

_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"


class Window(BaseModel):
    start: datetime
    hours: int = Field(gt=0)


class Forecast(BaseModel):
    region: str
    window: Window
    weights: list[float] = []


class Plan(BaseModel):
    region: str
    ends: datetime
    total: float
    seen: str


async def plan(forecast: Forecast) -> Plan:
    kinds = f"{type(forecast).__name__}/{type(forecast.window).__name__}/{type(forecast.window.start).__name__}"
    return Plan(
        region=forecast.region.upper(),
        ends=forecast.window.start + timedelta(hours=forecast.window.hours),
        total=sum(forecast.weights),
        seen=kinds,
    )


async def test_a_pydantic_model_round_trips_through_a_real_scheduler(scheduler: Scheduler) -> None:
    worker = Worker(target=scheduler.target, slots=1)
    worker.register("plan", plan)
    start = datetime(2026, 12, 1, 18, 30, tzinfo=UTC)
    async with worker, Client(scheduler.target) as client:
        submitted = await client.submit(
            plan, Forecast(region="gb", window=Window(start=start, hours=3), weights=[1, 2.5])
        )
        result = await submitted.result(timeout=timedelta(seconds=20))
        stored = await client.get(submitted.id)
    assert result == Plan(
        region="GB", ends=datetime(2026, 12, 1, 21, 30, tzinfo=UTC), total=3.5, seen="Forecast/Window/datetime"
    )
    assert stored.headers["content-type"] == "application/json"
    assert json.loads(stored.payload) == {
        "region": "gb",
        "window": {"start": "2026-12-01T18:30:00Z", "hours": 3},
        "weights": [1.0, 2.5],
    }
    assert json.loads(stored.result)["ends"] == "2026-12-01T21:30:00Z"


async def test_a_payload_the_model_refuses_fails_the_task_naming_the_field(scheduler: Scheduler) -> None:
    worker = Worker(target=scheduler.target, slots=1)
    worker.register("plan", plan)
    bad = {"region": "gb", "window": {"start": "2026-12-01T18:30:00Z", "hours": 0}}
    async with worker, Client(scheduler.target) as client:
        # As another language would send it: JSON with its content type, by the activity's name.
        task = await client.submit(
            "plan", json.dumps(bad), headers={"content-type": "application/json"}, max_attempts=1
        )
        done = await client.wait(task.id, timeout=timedelta(seconds=20))
    assert done.state == task_pb2.TASK_STATE_FAILED
    assert done.last_failure.error_type == "ValidationError"
    assert "window.hours" in done.last_failure.message
    assert "greater than 0" in done.last_failure.message


_TYPED = """
from datetime import UTC, datetime

from pydantic import BaseModel

from lowtide_client import Client, SyncClient, Worker

worker = Worker(target="127.0.0.1:50051")


class Forecast(BaseModel):
    region: str
    start: datetime


class Plan(BaseModel):
    region: str


class Other(BaseModel):
    name: str


@worker.activity("plan")
async def plan(forecast: Forecast) -> Plan:
    return Plan(region=forecast.region)


def clean(forecast: Forecast) -> Plan:
    return Plan(region=forecast.region)


async def main(client: Client, sync: SyncClient) -> None:
    submitted = await client.submit(plan, Forecast(region="gb", start=datetime.now(UTC)))
    reveal_type(await submitted.result())
    reveal_type(sync.submit(clean, Forecast(region="gb", start=datetime.now(UTC))).result())
    await client.submit(plan, Other(name="x"))  # line 37: the wrong model
    await client.submit(plan, Forecast(region="gb"))  # line 38: a required field missing
"""


@pytest.mark.slow
def test_a_pydantic_submit_is_checked_by_mypy_against_the_activity(tmp_path: Path) -> None:
    (tmp_path / "typed.py").write_text(_TYPED)
    # grpcio ships no type stubs: an application's mypy config says so, as lowtide's own does. The
    # client comes from its source folder here (MYPYPATH), so mypy would also report on the generated
    # stubs, which it keeps silent for an installed package.
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nstrict = True\n\n[mypy-grpc.*]\nignore_missing_imports = True\n\n"
        "[mypy-lowtide_proto.lowtide.*]\nignore_errors = True\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "typed.py"],
        cwd=tmp_path,
        env={"MYPYPATH": str(_CLIENT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("typed.py:")]
    notes = [line for line in lines if ": note: Revealed type is" in line]
    errors = [line.split(":")[1] for line in lines if ": error:" in line]
    assert notes == [
        'typed.py:35: note: Revealed type is "typed.Plan"',
        'typed.py:36: note: Revealed type is "typed.Plan"',
    ], done.stdout
    assert errors == ["37", "38"], done.stdout
    assert 'typed.py:37: error: Argument 1 to "submit" of "Client" has incompatible type' in done.stdout
    assert 'expected "Callable[[Other], Awaitable[Plan]]"' in done.stdout
    assert 'typed.py:38: error: Missing named argument "start" for "Forecast"' in done.stdout
    assert done.returncode == 1
