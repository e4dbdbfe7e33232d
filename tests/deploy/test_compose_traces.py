"""Keeps compose's tracing honest without a Docker engine: the observability profile's collector
config parses and routes traces from its OTLP receiver to Jaeger; the services are given that
receiver as their OTLP endpoint; and the compose services, run here as local processes with
OTEL_TRACES_EXPORTER=otlp, export a task's whole trace through a local OTLP receiver standing at
the collector's receiver (its port and protocol, read from the collector's config)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from lowtide_client import Client, TaskState
from tests.deploy.compose import REPO, PortMap, load_compose, local_service, start_order
from tests.deploy.test_compose import Stack, _healthy, _start, _stop
from tests.helpers import eventually
from tests.otlp import OtlpReceiver

COLLECTOR_CONFIG = REPO / "deploy" / "otel-collector" / "config.yaml"
TRACED = ["signal", "scheduler", "worker"]
COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


def _collector() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(COLLECTOR_CONFIG.read_text())
    return config


def _receiver_port(protocol: str) -> int:
    endpoint = _collector()["receivers"]["otlp"]["protocols"][protocol]["endpoint"]
    return int(endpoint.rsplit(":", 1)[1])


def test_the_collector_routes_traces_from_its_otlp_receiver_to_jaeger() -> None:
    config = _collector()
    pipeline = config["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    assert set(pipeline["processors"]) <= set(config["processors"])
    [exporter] = pipeline["exporters"]
    assert exporter.split("/")[0] == "otlp", "Jaeger takes OTLP in"
    assert config["exporters"][exporter]["endpoint"] == "jaeger:4317"
    services = load_compose()["services"]
    collector, jaeger = services["otel-collector"], services["jaeger"]
    assert collector["profiles"] == jaeger["profiles"] == ["observability"]
    mounted, inside = collector["volumes"][0].split(":")[:2]
    assert (REPO / mounted).resolve() == COLLECTOR_CONFIG
    assert collector["command"] == [f"--config={inside}"]
    assert "jaeger" in jaeger["image"] and "all-in-one" in jaeger["image"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_the_services_are_given_the_collector_receiver_and_trace_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = load_compose()["services"]
    grpc_port = _receiver_port("grpc")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    ports = PortMap("postgresql://unused")
    for name in TRACED:
        environment = services[name]["environment"]
        assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{grpc_port}", name
        assert environment["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc", name
        assert local_service(name, services[name], ports).env["OTEL_TRACES_EXPORTER"] == "none", name
    assert {services[n]["environment"]["OTEL_SERVICE_NAME"] for n in TRACED} == {
        "lowtide-signal",
        "lowtide-scheduler",
        "lowtide-demo-worker",
    }


@pytest.fixture
async def traced_stack(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Stack, OtlpReceiver]]:
    # What a user sets to see traces: `OTEL_TRACES_EXPORTER=otlp docker compose --profile observability up`.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    services = load_compose()["services"]
    ports = PortMap(database_url)
    stack = Stack(ports, {})
    # Where the collector's OTLP/gRPC receiver would be, on the port the services are given for it.
    async with OtlpReceiver(ports.local(_receiver_port("grpc"))) as receiver:
        try:
            for name in start_order(services, TRACED):
                service = local_service(name, services[name], ports)
                stack.running[name] = await _start(service, tmp_path)
                if service.health is not None:
                    await _healthy(stack, name)
            yield stack, receiver
        finally:
            for running in reversed(list(stack.running.values())):
                await _stop(running)


@pytest.mark.slow
async def test_compose_services_export_a_task_trace_through_the_collector_receiver(
    traced_stack: tuple[Stack, OtlpReceiver],
) -> None:
    stack, receiver = traced_stack
    scheduler = stack.running["scheduler"].service.env["LOWTIDE_SCHEDULER_LISTEN"]
    async with Client(scheduler) as client:
        task = await client.submit("echo", b"traced through compose")
        task = await client.wait(task.id, timeout=timedelta(seconds=20))
        assert task.state == COMPLETED, f"{task}\n{stack.logs()}"
    traceparent = dict(task.headers)["traceparent"]
    trace_id = traceparent.split("-")[1]

    async def whole() -> dict[str, tuple[str, str]]:
        spans = {s.name: (s.service, s.parent_id) for s in receiver.in_trace(trace_id)}
        wanted = {"/lowtide.v1.SchedulerService/SubmitStream", "task.dispatch", "task.run", "task.result"}
        return spans if wanted <= spans.keys() else {}

    try:
        spans = await eventually(whole, within=20)
    except AssertionError:
        seen = sorted({(s.service, s.name) for s in receiver.spans})
        raise AssertionError(f"no whole trace for task {task.id}; seen {seen}\n{stack.logs()}") from None
    submit = traceparent.split("-")[2]
    assert spans["/lowtide.v1.SchedulerService/SubmitStream"][0] == "lowtide-scheduler"
    assert spans["task.dispatch"] == ("lowtide-scheduler", submit)
    assert spans["task.run"] == ("lowtide-demo-worker", submit)
    assert spans["task.result"] == ("lowtide-scheduler", submit)
