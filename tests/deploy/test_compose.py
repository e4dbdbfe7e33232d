"""Keeps docker-compose.yml honest without a Docker engine: each lowtide service's own command,
with its own environment, runs here as a local process (host names mapped to 127.0.0.1, the test
database for `postgres`); they must pass their compose health checks, the compose-defined workers
must complete tasks submitted through the scheduler, and every metric Prometheus and the Grafana
dashboard rely on must be one the services really export."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from lowtide.config import SECTIONS, AuthConfig
from lowtide_client import Client, TaskState
from lowtide_proto.lowtide.v1 import task_pb2
from tests.deploy.compose import REPO, LocalService, PortMap, load_compose, local_service, published, start_order
from tests.deploy.conftest import run_lowtide
from tests.deploy.node import ensure_node_modules
from tests.helpers import eventually

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
PYTHON_SERVICES = ["signal", "scheduler", "console", "worker"]
# Metrics the lead is adding with fixed-start reservations: the dashboard has their panels
# already; they are required as soon as the scheduler's code names them.
FIXED_START_METRICS = {"lowtide_pool_fixed_start_hit_ratio", "lowtide_pool_desired_workers"}
_METRIC = re.compile(r"\blowtide_[a-z0-9_]+\b")


@dataclass
class Running:
    service: LocalService
    process: asyncio.subprocess.Process
    log: Path

    def tail(self) -> str:
        return f"--- {self.service.name} ({' '.join(self.service.argv)}):\n{self.log.read_text()[-3000:]}"


async def _start(service: LocalService, logs: Path) -> Running:
    log = logs / f"{service.name}.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *service.argv, cwd=service.cwd, env=service.env, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    return Running(service, process, log)


async def _stop(running: Running) -> None:
    process = running.process
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 10)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


@dataclass
class Stack:
    ports: PortMap
    running: dict[str, Running]

    def logs(self) -> str:
        return "\n".join(r.tail() for r in self.running.values())


@pytest.fixture
async def stack(database_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    compose = load_compose()
    services = compose["services"]
    names = [*PYTHON_SERVICES]
    if shutil.which("node") and shutil.which("npm"):
        await ensure_node_modules()
        names.append("node-worker")
    ports = PortMap(database_url)
    stack = Stack(ports, {})
    try:
        for name in start_order(services, names):
            service = local_service(name, services[name], ports)
            stack.running[name] = await _start(service, tmp_path)
            if service.health is not None:
                await _healthy(stack, name)
        yield stack
    finally:
        # Workers first, as `docker compose down` stops dependants before what they depend on.
        for running in reversed(list(stack.running.values())):
            await _stop(running)


async def _healthy(stack: Stack, name: str) -> None:
    """The service's own compose health check, run until it passes (compose retries it too)."""
    health = stack.running[name].service.health
    assert health is not None

    async def check() -> bool:
        if stack.running[name].process.returncode is not None:
            raise AssertionError(f"{name} exited with {stack.running[name].process.returncode}\n{stack.logs()}")
        ran = await run_lowtide(*health[3:], within=10)
        return ran.returncode == 0

    try:
        await eventually(check, within=30, interval=0.2)
    except AssertionError as error:
        raise AssertionError(f"{name} never became healthy: {error}\n{stack.logs()}") from None


def _target(stack: Stack, service: str, variable: str) -> str:
    return stack.running[service].service.env[variable]


async def _exported(url: str) -> set[str]:
    async with httpx.AsyncClient(timeout=5) as http:
        response = await http.get(url)
    response.raise_for_status()
    return {line.split("{")[0].split(" ")[0] for line in response.text.splitlines() if line and line[0] != "#"}


def _dashboard_metrics() -> set[str]:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "lowtide.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return {name for expr in exprs for name in _METRIC.findall(expr)}


def _fixed_start_metrics_landed() -> bool:
    return any("fixed_start_hit_rate" in path.read_text() for path in (REPO / "scheduler_service").rglob("*.py"))


def test_compose_environment_names_only_real_settings() -> None:
    # A misspelt LOWTIDE_ variable is silently ignored by the service: catch it here.
    known = {f"LOWTIDE_{section}_{f.name}".upper() for section, cls in SECTIONS.items() for f in fields(cls)}
    # [auth] is read apart from the other sections (its tokens are a list of tables).
    known |= {f"LOWTIDE_AUTH_{f.name}".upper() for f in fields(AuthConfig) if f.name != "tokens"} | {"LOWTIDE_AUTH"}
    for name, service in load_compose()["services"].items():
        for variable in service.get("environment") or {}:
            if variable.startswith("LOWTIDE_") and service.get("build") == ".":
                assert variable in known, f"{name}: {variable} is not a lowtide setting"


def test_every_service_of_the_stack_comes_back_when_it_exits() -> None:
    # The scheduler exits when a background loop fails, and both services when the database does
    # not answer as they start (a restarted PostgreSQL beside them): compose must start them again,
    # as `lowtide up` and Kubernetes do, or the stack stays down after one such exit.
    services = load_compose()["services"]
    default = [name for name, service in services.items() if not service.get("profiles")]
    assert {"postgres", "signal", "scheduler", "console", "worker", "node-worker"} <= set(default)
    assert {name: services[name].get("restart") for name in default} == dict.fromkeys(default, "unless-stopped")


def test_compose_publishes_every_port_on_loopback_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    # Auth is off in the compose stack: a port published on every interface would let anyone
    # on the network set the signal or submit work.
    services = load_compose()["services"]
    monkeypatch.delenv("LOWTIDE_PUBLISH_ADDR", raising=False)
    ports = {name: published(service) for name, service in services.items()}
    assert {port for _, _, port in ports["scheduler"] + ports["signal"]} == {50051, 50052, 9464, 9465}
    assert {address for entries in ports.values() for address, _, _ in entries} == {"127.0.0.1"}, ports
    # LOWTIDE_PUBLISH_ADDR (documented in docs/how-to/docker-compose.md, with auth on) publishes elsewhere.
    monkeypatch.setenv("LOWTIDE_PUBLISH_ADDR", "0.0.0.0")
    assert {address for service in services.values() for address, _, _ in published(service)} == {"0.0.0.0"}


def test_prometheus_scrapes_the_metrics_ports_the_services_listen_on() -> None:
    services = load_compose()["services"]
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert sorted(targets) == ["scheduler:9464", "signal:9465"]
    for target in targets:
        host, port = target.split(":")
        listen = services[host]["environment"][f"LOWTIDE_{host.upper()}_METRICS_LISTEN"]
        assert listen == f"0.0.0.0:{port}", f"{host} serves metrics on {listen}, Prometheus scrapes {target}"
    mounted = services["prometheus"]["volumes"][0].split(":")[0]
    assert (REPO / mounted).resolve() == REPO / "deploy" / "prometheus" / "prometheus.yml"


@pytest.mark.slow
async def test_compose_services_serve_work_and_export_the_dashboard_metrics(stack: Stack) -> None:
    scheduler = _target(stack, "scheduler", "LOWTIDE_SCHEDULER_LISTEN")
    async with Client(scheduler) as client:
        # The Python worker runs echo; the scheduler holds only `train` while the signal is high.
        task = await client.submit("echo", b"through compose")
        task = await client.wait(task.id, timeout=timedelta(seconds=20))
        assert task.state == COMPLETED, f"{task}\n{stack.logs()}"
        assert task.result == b"through compose"
        if "node-worker" in stack.running:
            task = await client.submit("upper", b"node worker")
            task = await client.wait(task.id, timeout=timedelta(seconds=20))
            assert task.state == COMPLETED, f"{task}\n{stack.logs()}"
            assert task.result == b"NODE WORKER"

            # Each worker joined the pool its compose service names. (The Node worker runs echo
            # too, so the Python worker may still be starting when both tasks are done.)
            async def both_pools() -> bool:
                return {"default", "node"} <= {pool.name for pool in (await client.status()).pools}

            try:
                await eventually(both_pools, within=30, interval=0.2)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{stack.logs()}") from None
        # Queue gauges exist for queues with work: leave one task no worker runs.
        await client.submit("compose-test-unclaimed", b"")
        if _fixed_start_metrics_landed():
            # The hit rate exists once a fixed start has run.
            spec = task_pb2.TaskSpec(activity_type="echo", payload=b"on time")
            spec.start_in.FromTimedelta(timedelta(milliseconds=500))
            spec.estimated_duration.FromTimedelta(timedelta(seconds=1))
            [fixed] = await client.submit_many([spec])
            task = await client.wait(fixed.id, timeout=timedelta(seconds=20))
            assert task.state == COMPLETED, f"{task}\n{stack.logs()}"

    # The console reaches both services at the addresses compose gives it, and draws the signal.
    console = _target(stack, "console", "LOWTIDE_CONSOLE_LISTEN").replace("0.0.0.0", "127.0.0.1")
    async with httpx.AsyncClient(timeout=10) as http:
        overview = await http.get(f"http://{console}/")
    assert overview.status_code == 200, overview.text[-2000:]
    assert 'class="threshold-line"' in overview.text and 'data-queue="default"' in overview.text

    scraped = {
        name: f"http://{_target(stack, name, f'LOWTIDE_{name.upper()}_METRICS_LISTEN')}/metrics"
        for name in ("scheduler", "signal")
    }
    wanted = _dashboard_metrics()
    if not _fixed_start_metrics_landed():
        wanted -= FIXED_START_METRICS

    async def missing() -> set[str]:
        exported: set[str] = set()
        for url in scraped.values():
            exported |= await _exported(url)
        return wanted - exported

    # Queue figures are read every metrics_interval (5 s by default, as compose leaves it). Time
    # held shows once a task was held and released: `train` is held while the replayed signal is
    # over its threshold (the trace's median, a replayed day a minute), so one is submitted each
    # round until one was.
    async def all_there() -> bool:
        async with Client(scheduler) as client:
            await client.submit("train", b"0")
        return not await missing()

    try:
        await eventually(all_there, within=90, interval=0.5)
    except AssertionError:
        raise AssertionError(f"the dashboard queries metrics nobody exports: {sorted(await missing())}") from None


def test_dashboard_has_the_panels_operators_look_for() -> None:
    wanted = {
        "lowtide_signal_value",
        "lowtide_signal_threshold",
        "lowtide_queue_held_depth",
        "lowtide_queue_depth",
        "lowtide_queue_running",
        "lowtide_task_dispatched_total",
        "lowtide_cost_hold",
        *FIXED_START_METRICS,
    }
    assert wanted <= _dashboard_metrics()
    provider = yaml.safe_load((REPO / "deploy" / "grafana" / "provisioning" / "dashboards" / "lowtide.yml").read_text())
    services: dict[str, Any] = load_compose()["services"]
    mounts = dict(volume.split(":")[:2] for volume in services["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["providers"][0]["options"]["path"]
