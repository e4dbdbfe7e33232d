"""Token authentication: what a caller without a token, with a wrong token, or with a token of
the wrong role sees, and that each role can do its own job through the real clients."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.auth import OPEN_SERVICES, SCHEDULER_METHODS, SIGNAL_METHODS, WORKER_METHODS, hash_token
from lowtide.config import AuthConfig, TokenEntry, load_config
from lowtide.errors import ConfigError
from lowtide_client import Client, SignalClient, TaskState, Worker
from lowtide_proto.lowtide.v1 import scheduler_pb2, signal_pb2, worker_pb2
from scheduler_service.api.keda import SERVICE_NAME as KEDA_SERVICE
from scheduler_service.server import Scheduler, start_scheduler
from signal_service.server import SignalServer
from tests.conftest import make_config
from tests.security.conftest import AUTH as AUTH_CONFIG
from tests.security.conftest import TOKENS

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")
CANCELLED = TaskState.Value("TASK_STATE_CANCELLED")
PENDING = TaskState.Value("TASK_STATE_PENDING")


async def code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        assert error.details(), "a refusal says why"
        return error.code()
    return grpc.StatusCode.OK


async def test_no_token_or_a_wrong_one_is_unauthenticated(guarded: Scheduler) -> None:
    async with Client(guarded.target) as anonymous, Client(guarded.target, token="guess") as guesser:
        assert await code_of(anonymous.submit("echo", b"x")) == grpc.StatusCode.UNAUTHENTICATED
        assert await code_of(guesser.list()) == grpc.StatusCode.UNAUTHENTICATED
        # The hash of a token is not a token.
        hashed = Client(guarded.target, token=hash_token(TOKENS["admin"]))
        async with hashed:
            assert await code_of(hashed.status()) == grpc.StatusCode.UNAUTHENTICATED
    async with Client(guarded.target) as anonymous:
        assert await code_of(anonymous.submit("echo", b"x")) == grpc.StatusCode.UNAUTHENTICATED


async def test_a_refused_submit_says_why_when_it_reaches_a_stream_already_ended(
    guarded_elsewhere: Scheduler,
) -> None:
    # The scheduler refuses the submit stream of a caller without a token as soon as it opens.
    # Whether the client's write of the submit comes before or after that refusal depends on
    # when its event loop gets to it; blocked a moment, after. grpc.aio then reports INTERNAL in
    # place of the scheduler's status (grpc/grpc#36066): the client must still say UNAUTHENTICATED.
    for turns in range(6):
        async with Client(guarded_elsewhere.target) as anonymous:
            refused = asyncio.ensure_future(code_of(anonymous.submit("echo", b"x")))
            for _ in range(turns):
                await asyncio.sleep(0)
            time.sleep(0.2)  # noqa: ASYNC251  # the loop blocked, as a busy process's: the refusal comes meanwhile
            assert await refused == grpc.StatusCode.UNAUTHENTICATED, f"blocked after {turns} turns"


async def test_health_stays_open_without_a_token(guarded: Scheduler) -> None:
    async with grpc.aio.insecure_channel(guarded.target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_each_role_does_its_job_and_nothing_more(guarded: Scheduler) -> None:
    worker = Worker(target=guarded.target, slots=1, token=TOKENS["worker"])

    @worker.activity("upper")
    def upper(payload: bytes) -> bytes:
        return payload.upper()

    async with (
        Client(guarded.target, token=TOKENS["submitter"]) as submitter,
        Client(guarded.target, token=TOKENS["admin"]) as admin,
        Client(guarded.target, token=TOKENS["worker"]) as as_worker,
        worker,
    ):
        task = await submitter.submit("upper", b"hi")
        done = await submitter.wait(task.id, timeout=timedelta(seconds=10))
        assert (done.state, done.result) == (COMPLETED, b"HI")
        assert [t.id for t in (await submitter.list()).tasks] == [task.id]
        assert (await submitter.explain(task.id)).task.id == task.id
        later = await submitter.submit("nobody-runs-this", b"")
        assert (await submitter.cancel(later.id)).state == CANCELLED

        # A submitter may not steer the scheduler; a worker token may not submit.
        assert await code_of(submitter.pause_queue("default")) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(submitter.status()) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(submitter.list_schedules()) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(as_worker.submit("echo", b"x")) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(as_worker.get(task.id)) == grpc.StatusCode.PERMISSION_DENIED

        # An admin may do all of it.
        assert (await admin.pause_queue("default")).paused
        assert not (await admin.resume_queue("default")).paused
        assert (await admin.get(task.id)).state == COMPLETED
        await admin.list_schedules()


async def test_a_viewer_reads_everything_and_changes_nothing(guarded: Scheduler, guarded_signal: SignalServer) -> None:
    async with (
        Client(guarded.target, token=TOKENS["admin"]) as admin,
        Client(guarded.target, token=TOKENS["viewer"]) as viewer,
        SignalClient(guarded_signal.target, token=TOKENS["viewer"]) as viewer_signal,
        SignalClient(guarded_signal.target, token=TOKENS["admin"]) as admin_signal,
    ):
        task = await admin.submit("nobody-runs-this", b"")
        assert (await viewer.get(task.id)).id == task.id
        assert [t.id for t in (await viewer.list()).tasks] == [task.id]
        assert (await viewer.explain(task.id)).task.id == task.id
        assert (await viewer.status()).hold.signal == (await admin.status()).hold.signal
        await viewer.list_schedules()
        await admin_signal.set(300.0)
        assert (await viewer_signal.get()).value == 300.0

        for refused in (
            viewer.submit("echo", b"x"),
            viewer.cancel(task.id),
            viewer.retry(task.id),
            viewer.pause_queue("default"),
            viewer.resume_queue("default"),
            viewer_signal.set(500.0),
        ):
            assert await code_of(refused) == grpc.StatusCode.PERMISSION_DENIED
        assert (await admin.get(task.id)).state == PENDING
        assert not any(q.paused for q in (await admin.status()).queues)
        assert (await admin_signal.get()).value == 300.0


async def test_a_submitter_token_cannot_connect_as_a_worker(guarded: Scheduler) -> None:
    async with grpc.aio.insecure_channel(guarded.target) as channel:
        connect = channel.stream_stream(
            "/lowtide.v1.WorkerService/Connect",
            request_serializer=worker_pb2.WorkerMessage.SerializeToString,
            response_deserializer=worker_pb2.SchedulerMessage.FromString,
        )
        for metadata, expected in (
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", f"Bearer {TOKENS['submitter']}"),), grpc.StatusCode.PERMISSION_DENIED),
        ):
            call = connect(iter(()), metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in call:
                    pass
            assert refused.value.code() == expected


async def test_only_an_admin_sets_a_signal_and_every_role_reads_it(guarded_signal: SignalServer) -> None:
    target = guarded_signal.target
    async with (
        SignalClient(target) as anonymous,
        SignalClient(target, token=TOKENS["submitter"]) as submitter,
        SignalClient(target, token=TOKENS["worker"]) as worker,
        SignalClient(target, token=TOKENS["admin"]) as admin,
    ):
        assert await code_of(anonymous.get()) == grpc.StatusCode.UNAUTHENTICATED
        assert await code_of(submitter.set(500.0)) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(worker.set(500.0)) == grpc.StatusCode.PERMISSION_DENIED
        assert (await admin.set(500.0)).value == 500.0
        assert (await submitter.get()).value == 500.0
        assert (await worker.get()).value == 500.0
        async for state in worker.subscribe():
            assert state.value == 500.0
            break


def test_every_rpc_has_a_row_in_a_role_table() -> None:
    """A method with no row needs admin; this makes adding one a decision, not an accident."""
    declared = {
        f"/{service.full_name}/{method.name}"
        for module, name in (
            (scheduler_pb2, "SchedulerService"),
            (worker_pb2, "WorkerService"),
            (signal_pb2, "SignalService"),
        )
        for service in [module.DESCRIPTOR.services_by_name[name]]
        for method in service.methods
    }
    admin_only = {
        f"/lowtide.v1.SchedulerService/{name}"
        for name in (
            "PauseQueue",
            "ResumeQueue",
            "CreateSchedule",
            "PauseSchedule",
            "ResumeSchedule",
            "DeleteSchedule",
        )
    }
    tables = {**SCHEDULER_METHODS, **WORKER_METHODS, **SIGNAL_METHODS}
    assert declared == set(tables) | admin_only
    assert all("admin" in roles for roles in tables.values())
    # The open services are the ones the scheduler really serves (a renamed one would be closed).
    assert KEDA_SERVICE in OPEN_SERVICES


async def test_tokens_never_reach_the_logs(guarded: Scheduler, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with Client(guarded.target, token="wrong-" + TOKENS["admin"]) as client:
        await code_of(client.submit("echo", b"x"))
    async with Client(guarded.target, token=TOKENS["worker"]) as client:
        await code_of(client.submit("echo", b"x"))
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "auth.denied" in logged
    for token in TOKENS.values():
        assert token not in logged


def test_auth_is_on_unless_switched_off_explicitly(tmp_path: Path) -> None:
    assert load_config(env={}).auth.enabled
    assert not load_config(env={"LOWTIDE_AUTH": "off"}).auth.enabled
    assert not load_config(env={"LOWTIDE_AUTH_ENABLED": "false"}).auth.enabled
    with pytest.raises(ConfigError, match="LOWTIDE_AUTH"):
        load_config(env={"LOWTIDE_AUTH": "maybe"})
    path = tmp_path / "lowtide.toml"
    digest = hash_token("ci-token")
    path.write_text(f'[[auth.tokens]]\nname = "ci"\nrole = "submitter"\nsha256 = "{digest}"\n')
    (entry,) = load_config(path, env={}).auth.tokens
    assert (entry.name, entry.role, entry.sha256) == ("ci", "submitter", digest)
    path.write_text(f'[[auth.tokens]]\nname = "ci"\nrole = "root"\nsha256 = "{digest}"\n')
    with pytest.raises(ConfigError, match="role must be one of"):
        load_config(path, env={})
    path.write_text('[[auth.tokens]]\nname = "ci"\nrole = "admin"\nsha256 = "ci-token"\n')
    with pytest.raises(ConfigError, match="64 hex digits"):
        load_config(path, env={})


async def test_a_service_refuses_to_start_open_or_locked_shut(database_url: str) -> None:
    open_remote = replace(make_config(listen="0.0.0.0:0"), auth=AuthConfig(enabled=False))
    with pytest.raises(ConfigError, match="not a loopback address and auth is off"):
        await start_scheduler(open_remote, database_url=database_url)
    no_tokens = replace(make_config(), auth=AuthConfig(enabled=True))
    with pytest.raises(ConfigError, match=r"\[auth\] tokens is empty"):
        await start_scheduler(no_tokens, database_url=database_url)
    forced = replace(open_remote, auth=AuthConfig(enabled=False, allow_insecure_remote=True))
    running = await start_scheduler(forced, database_url=database_url)
    await running.stop(grace=0.5)


def test_token_hash_prints_what_the_config_stores() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lowtide", "token", "hash"],
        input="s3cret\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.strip() == hash_token("s3cret")
    assert "s3cret" not in done.stdout + done.stderr


async def test_the_cli_sends_the_token_from_the_environment(guarded: Scheduler) -> None:
    import asyncio
    import os

    async def lowtide_list(**env: str) -> tuple[int, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lowtide",
            "task",
            "list",
            "--target",
            guarded.target,
            env={**base, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode or 0, (out + err).decode()

    code, text = await lowtide_list()
    assert (code, "UNAUTHENTICATED" in text) == (1, True), text
    code, text = await lowtide_list(LOWTIDE_TOKEN=TOKENS["worker"])
    assert (code, "PERMISSION_DENIED" in text) == (1, True), text
    code, text = await lowtide_list(LOWTIDE_TOKEN=TOKENS["submitter"])
    assert code == 0, text
    assert TOKENS["submitter"] not in text


def test_up_turns_auth_off_on_loopback_only_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from lowtide.config import Config, SchedulerConfig, SignalConfig
    from lowtide.up import dev_auth

    monkeypatch.delenv("LOWTIDE_AUTH", raising=False)
    env: dict[str, str] = {}
    assert dev_auth(Config(), env).startswith("OFF for local development")
    assert env["LOWTIDE_AUTH"] == "off"
    remote = Config(scheduler=SchedulerConfig(listen="0.0.0.0:50051"), signal=SignalConfig(listen="0.0.0.0:50052"))
    with pytest.raises(ConfigError, match="not loopback and no \\[auth\\] tokens"):
        dev_auth(remote, {})
    with_tokens = replace(remote, auth=replace(remote.auth, tokens=(TokenEntry("ci", "admin", "0" * 64),)))
    env = {}
    assert dev_auth(with_tokens, env) == "on, 1 token(s) in [auth] tokens"
    assert "LOWTIDE_AUTH" not in env
    monkeypatch.setenv("LOWTIDE_AUTH", "off")
    with pytest.raises(ConfigError, match="not a loopback address and auth is off"):
        dev_auth(replace(remote, auth=AuthConfig(enabled=False)), {})


async def test_the_demo_worker_connects_with_the_token_from_the_environment(guarded: Scheduler) -> None:
    import asyncio
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lowtide",
        "demo-worker",
        "--target",
        guarded.target,
        "--types",
        "echo",
        env={**base, "LOWTIDE_TOKEN": TOKENS["worker"]},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with Client(guarded.target, token=TOKENS["submitter"]) as client:
            task = await client.submit("echo", b"secured")
            done = await client.wait(task.id, timeout=timedelta(seconds=20))
    finally:
        worker.terminate()
        await asyncio.wait_for(worker.wait(), 20)
    assert (done.state, done.result) == (TaskState.Value("TASK_STATE_COMPLETED"), b"secured")


async def test_a_submitter_cancels_and_retries_only_its_own_tasks(database_url: str) -> None:
    other = "s-secret-other"
    auth = replace(
        AUTH_CONFIG, tokens=(*AUTH_CONFIG.tokens, TokenEntry("other-submitter", "submitter", hash_token(other)))
    )
    scheduler = await start_scheduler(replace(make_config(), auth=auth), database_url=database_url)
    try:
        async with (
            Client(scheduler.target, token=TOKENS["submitter"]) as mine,
            Client(scheduler.target, token=other) as theirs,
            Client(scheduler.target, token=TOKENS["admin"]) as admin,
        ):
            task = await mine.submit("echo")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await theirs.cancel(task.id)
            assert (await mine.get(task.id)).state == TaskState.Value("TASK_STATE_PENDING")
            assert (await mine.cancel(task.id)).state == TaskState.Value("TASK_STATE_CANCELLED")
            with pytest.raises(grpc.aio.AioRpcError) as retried:
                await theirs.retry(task.id)
            assert (await mine.get(task.id)).state == TaskState.Value("TASK_STATE_CANCELLED")
            assert (await mine.retry(task.id)).state == TaskState.Value("TASK_STATE_PENDING")
            theirs_task = await theirs.submit("echo")
            assert (await admin.cancel(theirs_task.id)).state == TaskState.Value("TASK_STATE_CANCELLED")
            assert (await admin.retry(theirs_task.id)).state == TaskState.Value("TASK_STATE_PENDING")
    finally:
        await scheduler.stop(grace=0.5)
    for refused in (caught.value, retried.value):
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"task {task.id} was not submitted by token 'other-submitter'" in (refused.details() or "")
