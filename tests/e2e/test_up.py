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

from tests.helpers import eventually, free_port

PIPE = asyncio.subprocess.PIPE


def user_env(data_dir: Path, listen: str) -> dict[str, str]:
    """A shell with no lowtide settings but the data folder and the address."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    env.update(
        LOWTIDE_DATABASE_DATA_DIR=str(data_dir),
        LOWTIDE_SCHEDULER_LISTEN=listen,
        # A free port too: 50052 is in the ephemeral range, and a connection of another test that
        # happens to hold it as its local port would keep the signal service from binding.
        LOWTIDE_SIGNAL_LISTEN=f"127.0.0.1:{free_port()}",
        # The web console too: 8080 may be taken on the machine running the tests.
        LOWTIDE_CONSOLE_LISTEN=f"127.0.0.1:{free_port()}",
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

    def __init__(self, tmp_path: Path, data_dir: Path | None = None) -> None:
        """`data_dir`: where the embedded PostgreSQL's data goes (see `embedded_data_dir`), else
        the test's tmp folder (a test whose services use another database)."""
        self.tmp = tmp_path
        self.data_dir = (data_dir or tmp_path) / "data"
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
async def session(tmp_path: Path, embedded_data_dir: Path) -> AsyncIterator[Session]:
    running = Session(tmp_path, embedded_data_dir)
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


HELD = re.compile(r'^lowtide_queue_held_depth\{queue="default"\} [1-9]', re.M)


def test_up_demo_shows_held_work_while_the_replayed_signal_is_high(tmp_path: Path, embedded_data_dir: Path) -> None:
    """`lowtide up --demo`: the replayed trace crosses its threshold and the live line shows it."""
    data_dir = embedded_data_dir / "data"
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
        # While it runs, both metrics ports answer with the documented names and live values,
        # and the console's overview tells the same story in sentences.
        scraped = {scheduler_metrics: scrape(scheduler_metrics, until=HELD), signal_metrics: scrape(signal_metrics)}
        overview = fetch(f"http://{env['LOWTIDE_CONSOLE_LISTEN']}/")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        pid = postmaster_pid(data_dir / "demo")
        if pid is not None:
            os.kill(pid, signal.SIGQUIT)
    assert postmaster_pid(data_dir / "demo") is None, "the embedded PostgreSQL outlived `lowtide up`"
    text = "".join(lines)
    # The demo's database is its own: `demo` in the data folder, and nothing in the folder of
    # `lowtide up` (whose tasks and signal would otherwise show up in the demo, and the demo's in it).
    assert f"creating its database in {data_dir / 'demo'} ..." in text
    assert not (data_dir / "pgdata").exists()
    assert "lowtide is up" in text and "feed: replay" in text
    assert "low  - releasing" in text
    assert f"console:   http://{env['LOWTIDE_CONSOLE_LISTEN']}/" in text
    assert "The signal is HIGH" in overview and "wait for a lower signal" in overview, overview[-3000:]
    assert 'class="signal-line"' in overview and 'class="threshold-line"' in overview
    assert any("HIGH - holding train" in line and " held    0 " not in line for line in lines), text[-2000:]
    assert HELD.search(scraped[scheduler_metrics]), scraped[scheduler_metrics][-2000:]
    assert re.search(r'^lowtide_cost_hold\{queue="default",signal="grid"\} 1\.0', scraped[scheduler_metrics], re.M)
    assert re.search(r'^lowtide_task_dispatched_total\{pool="default"\} [1-9]', scraped[scheduler_metrics], re.M)
    assert re.search(r'^lowtide_signal_value\{signal="grid",unit="gCO2/kWh"\} 2\d\d', scraped[signal_metrics], re.M)
    assert re.search(r'^lowtide_signal_high\{signal="grid",unit="gCO2/kWh"\} 1\.0', scraped[signal_metrics], re.M)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def scrape(port: int, until: re.Pattern[str] | None = None, within: float = 15.0) -> str:
    """The /metrics page; with `until`, read again (up to `within` seconds) until it matches: the
    figures are refreshed every metrics interval, maybe after what the test saw elsewhere."""
    deadline = time.monotonic() + within
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = str(response.read().decode())
        if until is None or until.search(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


# What the embedded server's initdb and pg_ctl print, which `up` keeps back unless it fails.
INITDB_OUTPUT = (
    "The files belonging to this database system",
    "Success. You can now start the database server",
    "Running commandline",
    "Successful postgres command",
    "initdb",
)


async def read_all(process: asyncio.subprocess.Process, within: float) -> list[str]:
    """Everything the process prints on stdout until it exits (or fails the test after `within`)."""
    assert process.stdout is not None
    try:
        out = await asyncio.wait_for(process.stdout.read(), within)
    except TimeoutError:
        raise AssertionError(f"process {process.pid} still running after {within}s") from None
    await exited(process, within=10)
    return out.decode().splitlines()


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, with their command lines."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # The parent pid is the 2nd field after the command name, which is in parentheses.
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


@pytest.mark.slow
async def test_first_start_shows_one_line_per_step_and_not_the_initdb_log(session: Session) -> None:
    up, printed = await session.up()
    await ctrl_c(session, up)
    # Up to the banner: its own steps, one line each, and the services' "listening on" lines.
    before = printed[: next(i for i, line in enumerate(printed) if "lowtide is up" in line)]
    steps = [line for line in before if not line.startswith("lowtide ")]
    expected = [
        f"embedded PostgreSQL: first start, creating its database in {session.data_dir} ...",
        "database schema: ",
        "starting the signal service on ",
        "starting the scheduler service on ",
        "starting the console on ",
    ]
    assert len(steps) == len(expected), printed
    assert all(line.startswith(prefix) for line, prefix in zip(steps, expected, strict=True)), printed
    everything = printed + session.log("up.log").splitlines()
    noise = [line for line in everything if any(text in line for text in INITDB_OUTPUT)]
    assert noise == [], "\n".join(everything)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            "port",
            "lowtide up: the scheduler service exited (78): [scheduler] listen: cannot listen on {target}: "
            "address already in use",
        ),
        ("feed", "lowtide up: the signal service exited (78): [signal] region: the electricitymaps feed needs a zone"),
    ],
)
async def test_up_stops_with_the_service_s_own_error_when_a_service_cannot_start(
    session: Session, breakage: str, message: str
) -> None:
    with socket.socket() as taken:
        if breakage == "port":
            host, port = session.target.rsplit(":", 1)
            taken.bind((host, int(port)))
            taken.listen()
        else:
            session.env["LOWTIDE_SIGNAL_FEED"] = "electricitymaps"  # and no LOWTIDE_SIGNAL_REGION
        up = await session.spawn("up", log="up.log", group=True)
        printed = await read_all(up, within=120)
    assert up.returncode == 78, session.log("up.log")
    assert not any("lowtide is up" in line for line in printed), printed
    assert message.format(target=session.target) in session.log("up.log"), session.log("up.log")
    # One failure, told once: the service was not restarted over and over.
    assert session.log("up.log").count("lowtide up: ") == 1, session.log("up.log")
    assert postmaster_pid(session.data_dir) is None, "the embedded PostgreSQL outlived `lowtide up`"


def scheduler_child(up: asyncio.subprocess.Process) -> int | None:
    return next((pid for pid, command in children(up.pid).items() if "scheduler serve" in command), None)


@pytest.mark.slow
async def test_sigterm_while_a_service_is_not_ready_yet_stops_at_once_without_the_banner(session: Session) -> None:
    up = await session.spawn("up", log="up.log", group=True)
    printed = await read_until(up, "starting the scheduler service", within=120)

    # A scheduler frozen before it serves never becomes ready: `up` waits for it...
    async def started() -> int | None:
        return scheduler_child(up)

    frozen = await eventually(started, within=30, interval=0.01)
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)
    # ... until it is told to stop, which it does at once rather than once the wait times out.
    up.send_signal(signal.SIGTERM)
    printed += await read_all(up, within=30)
    assert up.returncode == 0, session.log("up.log")
    assert not any("lowtide is up" in line for line in printed), printed
    assert "stopping ..." in printed
    assert scheduler_child(up) is None
    assert postmaster_pid(session.data_dir) is None, "the embedded PostgreSQL outlived `lowtide up`"


@pytest.mark.slow
async def test_sigterm_kills_a_service_that_does_not_stop_within_the_grace(session: Session) -> None:
    up, _ = await session.up()
    frozen = scheduler_child(up)
    assert frozen is not None
    # Serving, so SIGTERM is handled by the scheduler: stopped, it cannot handle it.
    os.kill(frozen, signal.SIGSTOP)
    up.send_signal(signal.SIGTERM)
    # The grace is 10 s; the bound leaves room for a loaded machine.
    await read_all(up, within=60)
    assert up.returncode == 0, session.log("up.log")
    log = session.log("up.log")
    assert re.search(r"up\.killed service=scheduler pid=" + str(frozen), log), log
    assert scheduler_child(up) is None
    assert postmaster_pid(session.data_dir) is None, "the embedded PostgreSQL outlived `lowtide up`"


def test_up_recorded_without_demo_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    env = user_env(tmp_path / "data", f"127.0.0.1:{free_port()}")
    done = subprocess.run(
        [sys.executable, "-m", "lowtide", "up", "--recorded"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--demo --recorded" in done.stderr and 'feed = "recorded"' in done.stderr
    assert not (tmp_path / "data").exists()
