"""The Node.js worker library's own tests (`node --test` in clients/node), run against a real
scheduler started here: connect, assignments, batched results, failures, heartbeats, cancel,
drain; and against one with token auth and mutual TLS on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from lowtide.config import TlsConfig
from lowtide_proto.lowtide.v1 import worker_pb2
from scheduler_service.server import Scheduler, start_scheduler
from tests.conftest import make_config
from tests.deploy.node import NODE_DIR, ensure_node_modules, node_or_skip, run_bounded
from tests.security.certs import Pki, make_pki
from tests.security.conftest import TOKENS, secured


async def _drain_when_busy(scheduler: Scheduler) -> None:
    """The scheduler side of a drain for the Node drain test: once a worker whose id starts with
    "drain-" runs an attempt, it gets no more work and is sent a Drain on its stream (once per id:
    the worker then closes that stream and connects again)."""
    drained: set[str] = set()
    while True:
        for session in list(scheduler.registry):
            if session.worker_id.startswith("drain-") and session.in_flight and session.worker_id not in drained:
                drained.add(session.worker_id)
                session.draining = True
                drain = worker_pb2.Drain(reason="scheduler maintenance", grace=duration_pb2.Duration(seconds=10))
                session.send(worker_pb2.SchedulerMessage(drain=drain))
        await asyncio.sleep(0.02)


async def test_node_worker_library_passes_its_tests_against_a_real_scheduler(scheduler: Scheduler) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    drainer = asyncio.create_task(_drain_when_busy(scheduler))
    try:
        code, out, err = await run_bounded(
            node,
            "--test",
            "--test-reporter=tap",
            "test/",
            cwd=NODE_DIR,
            env=dict(os.environ, LOWTIDE_TARGET=scheduler.target),
            within=120,
        )
    finally:
        drainer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drainer
    assert code == 0, f"node --test failed ({code}):\n{out}\n{err}"
    passed = re.search(r"^# pass (\d+)$", out, re.MULTILINE)
    failed = re.search(r"^# fail (\d+)$", out, re.MULTILINE)
    assert passed and failed, out
    assert int(passed.group(1)) >= 6, out
    assert int(failed.group(1)) == 0, out


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


@pytest.fixture
async def guarded_tls(database_url: str, pki: Pki) -> AsyncIterator[Scheduler]:
    """A scheduler with token auth and mutual TLS on."""
    tls = TlsConfig(cert=str(pki.server.cert), key=str(pki.server.key), client_ca=str(pki.ca))
    running = await start_scheduler(replace(secured(make_config()), tls=tls), database_url=database_url)
    yield running
    await running.stop(grace=1.0)


async def test_node_worker_with_a_token_over_mutual_tls(guarded_tls: Scheduler, pki: Pki) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    env = dict(
        os.environ,
        LOWTIDE_TARGET=guarded_tls.target,
        LOWTIDE_TOKEN=TOKENS["worker"],
        LOWTIDE_SUBMIT_TOKEN=TOKENS["submitter"],
        LOWTIDE_CA=str(pki.ca),
        LOWTIDE_CERT=str(pki.client.cert),
        LOWTIDE_KEY=str(pki.client.key),
    )
    code, out, err = await run_bounded(
        node, "--test", "--test-reporter=tap", "test/security.test.js", cwd=NODE_DIR, env=env, within=60
    )
    assert code == 0, f"node --test failed ({code}):\n{out}\n{err}"
    assert re.search(r"^# pass 5$", out, re.MULTILINE), out
    assert re.search(r"^# skipped 0$", out, re.MULTILINE), out
