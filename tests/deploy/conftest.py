"""Fixtures and helpers for running lowtide as an operator does: the `lowtide` command in a
separate process, services on loopback, a signal service beside the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import pytest

from lowtide.config import Config, SignalConfig
from signal_service.server import SignalServer, start_signal_service
from tests.conftest import NO_AUTH
from tests.deploy import go_toolchain


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Go is installed once, after collection and before any test (its minutes are not counted
    against a test's timeout), only when the Go worker's test is to run."""
    if any(item.path.name in ("test_go_worker.py", "test_go_tutorial.py") for item in items):
        go_toolchain.ensure()


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def run_lowtide(*args: str, env: Mapping[str, str] | None = None, within: float = 30.0) -> Ran:
    """Runs `python -m lowtide ARGS` without blocking the event loop (the services under test
    answer on this same loop), killing it if it outlives `within` seconds."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lowtide",
        *args,
        env=dict(os.environ if env is None else env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), within)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


@pytest.fixture
async def signal_service(database_url: str) -> AsyncIterator[SignalServer]:
    running = await start_signal_service(
        Config(signal=SignalConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"), auth=NO_AUTH),
        database_url=database_url,
    )
    yield running
    await running.stop(grace=0.5)
