"""`lowtide up` as a user runs it, every step a process: the embedded PostgreSQL starts from an
empty data folder, a demo worker completes a task submitted with `lowtide task submit`, Ctrl-C
stops everything (the database too), and a task left pending is still there after `up` starts
again on the same folder."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

PIPE = asyncio.subprocess.PIPE


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def user_env(data_dir: Path, listen: str) -> dict[str, str]:
    """A shell with no lowtide settings but the data folder and the address."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    env.update(
        LOWTIDE_DATABASE_DATA_DIR=str(data_dir),
        LOWTIDE_SCHEDULER_LISTEN=listen,
        # A free port too: 50052 is in the ephemeral range, and a connection of another test that
        # happens to hold it as its local port would keep the signal service from binding.
        LOWTIDE_SIGNAL_LISTEN=f"127.0.0.1:{free_port()}",
        # Off: a fixed metrics port could be taken on the machine running the tests.
        LOWTIDE_SCHEDULER_METRICS_LISTEN="",
        LOWTIDE_SIGNAL_METRICS_LISTEN="",
    )
    return env


def postmaster_pid(data_dir: Path) -> int | None:
    """The embedded server's pid while it runs (PostgreSQL removes the file when it stops)."""
    try:
        return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


async def exited(process: asyncio.subprocess.Process, within: float) -> int:
    try:
        return await asyncio.wait_for(process.wait(), within)
    except TimeoutError:
        raise AssertionError(f"process {process.pid} still running after {within}s") from None


async def read_until(process: asyncio.subprocess.Process, text: str, within: float) -> list[str]:
    """Lines of the process's stdout up to (and with) the first containing `text`."""
    assert process.stdout is not None
    lines: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            raw = await asyncio.wait_for(process.stdout.readline(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise AssertionError(f"no {text!r} within {within}s; printed so far: {lines}") from None
        if not raw:
            raise AssertionError(f"exited ({await process.wait()}) before printing {text!r}: {lines}")
        lines.append(raw.decode().rstrip("\n"))
        if text in lines[-1]:
            return lines


class Session:
    """Every process the test starts, stopped (and the embedded database with them) at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.data_dir = tmp_path / "data"
        self.env = user_env(self.data_dir, f"127.0.0.1:{free_port()}")
        self.target = self.env["LOWTIDE_SCHEDULER_LISTEN"]
        self.processes: list[asyncio.subprocess.Process] = []

    async def spawn(self, *args: str, log: str, group: bool = False) -> asyncio.subprocess.Process:
        with (self.tmp / log).open("ab") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "lowtide",
                *args,
                cwd=self.tmp,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=PIPE,
                stderr=stderr,
                start_new_session=group,
            )
        self.processes.append(process)
        return process

    async def up(self) -> tuple[asyncio.subprocess.Process, list[str]]:
        # Its own process group, as in a terminal, so Ctrl-C (SIGINT to the group) reaches the
        # services it runs too, and a failed test can kill the whole tree.
        process = await self.spawn("up", log="up.log", group=True)
        try:
            printed = await read_until(process, "lowtide is up", within=60)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.log('up.log')}") from None
        # The rest of the banner, which ends with how to stop it.
        return process, printed + await read_until(process, "Ctrl-C", within=5)

    async def cli(self, *args: str) -> dict[str, Any]:
        """Runs a `lowtide task ...` command with --json; returns the object it printed."""
        process = await self.spawn("task", *args, "--json", "--target", self.target, log="cli.log")
        try:
            out, _ = await asyncio.wait_for(process.communicate(), 30)
        except TimeoutError:
            raise AssertionError(f"lowtide task {' '.join(args)} did not finish within 30 s") from None
        assert process.returncode == 0, f"lowtide task {args}: exit {process.returncode}\n{self.log('cli.log')}"
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return result

    def log(self, name: str) -> str:
        path = self.tmp / name
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    async def close(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL) if self._leads_group(process) else process.kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 10)
        # `up` stops the embedded server when it exits; after a SIGKILL nobody did, so do it here.
        pid = postmaster_pid(self.data_dir)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)  # PostgreSQL's immediate shutdown
            for _ in range(100):
                if postmaster_pid(self.data_dir) is None:
                    break
                await asyncio.sleep(0.1)

    @staticmethod
    def _leads_group(process: asyncio.subprocess.Process) -> bool:
        with contextlib.suppress(ProcessLookupError):
            return os.getpgid(process.pid) == process.pid
        return False


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[Session]:
    running = Session(tmp_path)
    try:
        yield running
    finally:
        await running.close()


async def ctrl_c(session: Session, up: asyncio.subprocess.Process) -> None:
    os.killpg(up.pid, signal.SIGINT)
    code = await exited(up, within=20)
    assert code == 0, session.log("up.log")
    assert postmaster_pid(session.data_dir) is None, "the embedded PostgreSQL still runs after `up` exited"


@pytest.mark.slow
async def test_up_runs_tasks_and_keeps_them_across_a_restart(session: Session) -> None:
    up, printed = await session.up()
    assert any("embedded PostgreSQL" in line and str(session.data_dir) in line for line in printed), printed
    assert any(session.target in line for line in printed), printed

    worker = await session.spawn("demo-worker", "--types", "echo", "--target", session.target, log="worker.log")
    done = await session.cli("submit", "echo", "--payload", "hi")
    assert (done["activity_type"], done["state"], done["result"], done["attempt"]) == ("echo", "completed", "hi", 1)

    # No worker runs `sleep`, so this one stays pending.
    waiting = await session.cli("submit", "sleep", "--payload", "1", "--no-wait")
    assert waiting["state"] == "pending"

    worker.send_signal(signal.SIGTERM)
    assert await exited(worker, within=15) == 0, session.log("worker.log")
    await ctrl_c(session, up)

    up, _ = await session.up()
    still = await session.cli("get", str(waiting["id"]))
    earlier = await session.cli("get", str(done["id"]))
    assert (still["id"], still["activity_type"], still["state"], still["payload"]) == (
        waiting["id"],
        "sleep",
        "pending",
        "1",
    )
    assert (earlier["state"], earlier["result"]) == ("completed", "hi")
    await ctrl_c(session, up)


def test_up_demo_shows_held_work_while_the_replayed_signal_is_high(tmp_path: Path) -> None:
    """`lowtide up --demo`: the replayed trace crosses its threshold and the live line shows it."""
    data_dir = tmp_path / "data"
    env = user_env(data_dir, f"127.0.0.1:{free_port()}")
    scheduler_metrics, signal_metrics = free_port(), free_port()
    env.update(
        LOWTIDE_SIGNAL_LISTEN=f"127.0.0.1:{free_port()}",
        LOWTIDE_LOG_LEVEL="WARNING",
        LOWTIDE_SCHEDULER_METRICS_LISTEN=f"127.0.0.1:{scheduler_metrics}",
        LOWTIDE_SIGNAL_METRICS_LISTEN=f"127.0.0.1:{signal_metrics}",
        LOWTIDE_SCHEDULER_METRICS_INTERVAL="500ms",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "lowtide", "up", "--demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 90
        # The trace's second day rises over the threshold (215) within a minute at a day/minute.
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "HIGH - holding train" in line and " held    0 " not in line:
                break
        # While it runs, both metrics ports answer with the documented names and live values.
        scraped = {port: scrape(port) for port in (scheduler_metrics, signal_metrics)}
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        pid = postmaster_pid(data_dir)
        if pid is not None:
            os.kill(pid, signal.SIGQUIT)
    assert postmaster_pid(data_dir) is None, "the embedded PostgreSQL outlived `lowtide up`"
    text = "".join(lines)
    assert "lowtide is up" in text and "feed: replay" in text
    assert "low  - releasing" in text
    assert any("HIGH - holding train" in line and " held    0 " not in line for line in lines), text[-2000:]
    assert re.search(r'^lowtide_queue_held_depth\{queue="default"\} [1-9]', scraped[scheduler_metrics], re.M)
    assert re.search(r'^lowtide_cost_hold\{queue="default",signal="grid"\} 1\.0', scraped[scheduler_metrics], re.M)
    assert re.search(r'^lowtide_tasks_dispatched_total\{pool="default"\} [1-9]', scraped[scheduler_metrics], re.M)
    assert re.search(r'^lowtide_signal_value\{signal="grid",unit="gCO2/kWh"\} 2\d\d', scraped[signal_metrics], re.M)
    assert re.search(r'^lowtide_signal_high\{signal="grid",unit="gCO2/kWh"\} 1\.0', scraped[signal_metrics], re.M)


def scrape(port: int) -> str:
    """The /metrics page, waiting up to a few seconds for a refresh with live figures."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())
