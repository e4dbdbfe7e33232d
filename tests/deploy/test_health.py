"""`lowtide health` and server reflection against real services on loopback: what a container
health check, a Kubernetes probe or `grpcurl list` sees."""

from __future__ import annotations

import json
import re

import grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from scheduler_service.server import Scheduler
from signal_service.server import SignalServer
from tests.deploy.compose import REPO
from tests.deploy.conftest import run_lowtide
from tests.helpers import free_port


async def test_health_is_serving_for_the_scheduler_and_its_services(scheduler: Scheduler) -> None:
    ran = await run_lowtide("health", "--target", scheduler.target)
    assert ran.returncode == 0, ran.stderr
    assert "SERVING" in ran.stdout
    for service in ("lowtide.v1.SchedulerService", "lowtide.v1.WorkerService"):
        ran = await run_lowtide("health", "--target", scheduler.target, "--service", service, "--json")
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout) == {"serving": True, "message": f"{service} at {scheduler.target}: SERVING"}


async def test_health_is_serving_for_the_signal_service(signal_service: SignalServer) -> None:
    ran = await run_lowtide("health", "--target", signal_service.target, "--service", "lowtide.v1.SignalService")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"lowtide.v1.SignalService at {signal_service.target}: SERVING"


async def test_health_fails_with_a_reason_when_nothing_listens() -> None:
    target = f"127.0.0.1:{free_port()}"
    ran = await run_lowtide("health", "--target", target, "--timeout", "2")
    assert ran.returncode == 1
    assert f"server at {target}: UNAVAILABLE" in ran.stderr


async def test_health_fails_for_a_service_the_server_does_not_have(scheduler: Scheduler) -> None:
    ran = await run_lowtide("health", "--target", scheduler.target, "--service", "lowtide.v1.SignalService")
    assert ran.returncode == 1
    assert "unknown service" in ran.stderr


async def test_health_goes_not_serving_when_the_scheduler_shuts_down(scheduler: Scheduler) -> None:
    # What a probe sees during a graceful shutdown, before the port closes.
    await scheduler.health.enter_graceful_shutdown()
    ran = await run_lowtide("health", "--target", scheduler.target)
    assert ran.returncode == 1
    assert "NOT_SERVING" in ran.stderr


async def _listed_services(target: str) -> set[str]:
    """What `grpcurl -plaintext TARGET list` prints, through the reflection service."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request]), timeout=5):
            return {service.name for service in response.list_services_response.service}
    raise AssertionError("the reflection stream ended without an answer")


async def test_reflection_lists_the_services_of_both_servers(
    scheduler: Scheduler, signal_service: SignalServer
) -> None:
    listed = await _listed_services(scheduler.target) | await _listed_services(signal_service.target)
    assert {
        "lowtide.v1.SchedulerService",
        "lowtide.v1.WorkerService",
        "lowtide.v1.SignalService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= listed


async def test_reflection_describes_the_worker_protocol(scheduler: Scheduler) -> None:
    # grpcurl describe needs the file descriptors, not only the names: a client in another
    # language can then build requests with no .proto files at hand.
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="lowtide.v1.WorkerService")
        async for response in stub.ServerReflectionInfo(iter([request]), timeout=5):
            files = response.file_descriptor_response.file_descriptor_proto
            assert files, response
            assert any(b"lowtide/v1/worker.proto" in data for data in files)
            return


def _dockerfile_healthcheck() -> list[str]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", text, re.MULTILINE)
    assert match, "the image has no exec-form HEALTHCHECK"
    command: list[str] = json.loads(match.group(1))
    return command


def test_the_image_runs_lowtide_as_a_non_root_user() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["lowtide"\]$', text, re.MULTILINE)
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")


async def test_the_image_health_check_passes_against_a_serving_scheduler(scheduler: Scheduler) -> None:
    command = _dockerfile_healthcheck()
    assert command[:2] == ["lowtide", "health"]
    # The image checks the scheduler's default port; here the scheduler listens on a free one.
    args = [scheduler.target if arg == "127.0.0.1:50051" else arg for arg in command[1:]]
    ran = await run_lowtide(*args)
    assert ran.returncode == 0, ran.stderr
