"""The console as a user meets it: the signal service, the scheduler and `lowtide console`, each
its own process as `lowtide up` runs them, and one headless Chromium for the whole session
(Debian's `chromium` and `chromium-driver`, installed here when missing, as CI starts bare).

Screenshots go to $LOWTIDE_CONSOLE_SCREENSHOTS when set (e.g. docs/), else to the run's tmp dir."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.remote.webdriver import WebDriver

from lowtide.auth import hash_token
from tests.debian import install
from tests.helpers import free_port

TOKENS = {"admin": "console-admin-secret", "viewer": "console-viewer-secret"}
# The trace the signal service replays at wall-clock speed: a low first half hour (the value a
# SetSignal overrides), a high two hours, then the cheapest window, which the planner picks.
THRESHOLD = 250
TRACE = [150, 300, 320, 310, 90, 95, 300, 310, 320, 330, 340, 350, 360, 370]


def _install_chromium() -> str | None:
    """Installs Debian's chromium and chromium-driver when missing; returns why it could not, or None."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return None
    return install(["chromium", "chromium-driver"])


_NOT_INSTALLED: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The install runs once, after collection and before any test, so that its minutes are not
    counted against the first test's timeout; only when a console test is to run."""
    here = Path(__file__).parent
    if any(here in item.path.parents for item in items):
        problem = _install_chromium()
        if problem:
            _NOT_INSTALLED.append(problem)


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    if _NOT_INSTALLED or not shutil.which("chromedriver"):
        pytest.fail(f"the console tests need chromium and chromium-driver: {_NOT_INSTALLED or 'not installed'}")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,1700"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=ChromeService(shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("LOWTIDE_CONSOLE_SCREENSHOTS")
    folder = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class Stack:
    """The three processes, their addresses, and the `lowtide` CLI pointed at them."""

    env: dict[str, str]
    logs: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.env['LOWTIDE_CONSOLE_LISTEN']}"

    @property
    def scheduler(self) -> str:
        return self.env["LOWTIDE_SCHEDULER_LISTEN"]

    def start(self, name: str, *args: str) -> None:
        with (self.logs / f"{name}.log").open("ab") as log:
            self.processes.append(
                subprocess.Popen([sys.executable, "-m", "lowtide", *args], env=self.env, stdout=log, stderr=log)
            )

    def cli(self, *args: str, token: str | None = None) -> Any:
        env = dict(self.env, **({"LOWTIDE_TOKEN": token} if token else {}))
        command = [sys.executable, "-m", "lowtide", *args, "--json"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, f"lowtide {' '.join(args)}: {done.stderr}"
        return json.loads(done.stdout.strip().splitlines()[-1])

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}:\n{p.read_text()[-2000:]}" for p in sorted(self.logs.glob("*.log")))

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _serving(target: str, within: float) -> None:
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=within)


def _answering(url: str, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/static/console.css", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the console at {url} did not answer within {within}s")
        time.sleep(0.1)


def _trace(folder: Path) -> Path:
    start = datetime(2020, 1, 1, tzinfo=UTC)
    rows = [f"{(start + timedelta(minutes=30 * i)).strftime('%Y-%m-%d %H:%M:%S')},{v}" for i, v in enumerate(TRACE)]
    path = folder / "trace.csv"
    path.write_text("Time,Carbon Intensity\n" + "\n".join(rows) + "\n")
    return path


# An adaptive type (issue 21): the pools page shows its limit (its initial one: nothing runs it).
ADAPTIVE = "[types.call_api]\nadaptive_concurrency = { min = 1, max = 50, initial = 4 }\n\n"
# A second signal, set by hand: the overview draws it beside the default one.
PRICE = '[signals.price]\nunit = "EUR/MWh"\nthreshold = 80.0\n\n'


def _config(folder: Path, *, auth: bool, extra: str = "") -> Path:
    tokens = "".join(
        f'[[auth.tokens]]\nname = "{role}"\nrole = "{role}"\nsha256 = "{hash_token(token)}"\n\n'
        for role, token in TOKENS.items()
    )
    path = folder / "lowtide.toml"
    guarded = f'[auth]\nsignal_token = "{TOKENS["admin"]}"\n\n{tokens}' if auth else ""
    path.write_text(ADAPTIVE + PRICE + extra + guarded)
    return path


def start_stack(
    database_url: str, folder: Path, *, auth: bool, feed: dict[str, str] | None = None, config: str = ""
) -> Stack:
    """The three processes; `feed` replaces the replayed trace's settings (LOWTIDE_SIGNAL_*),
    `config` is added to the configuration file (TOML sections)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    scheduler, signal = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env.update(
        LOWTIDE_DATABASE_URL=database_url,
        LOWTIDE_SCHEDULER_LISTEN=scheduler,
        LOWTIDE_SIGNAL_LISTEN=signal,
        LOWTIDE_SCHEDULER_SIGNAL_TARGET=signal,
        LOWTIDE_SCHEDULER_METRICS_LISTEN="",
        LOWTIDE_SIGNAL_METRICS_LISTEN="",
        LOWTIDE_CONSOLE_LISTEN=f"127.0.0.1:{free_port()}",
        LOWTIDE_CONSOLE_SCHEDULER_TARGET=scheduler,
        LOWTIDE_CONSOLE_SIGNAL_TARGET=signal,
        LOWTIDE_CONSOLE_REFRESH="500ms",
        LOWTIDE_SIGNAL_FEED="replay",
        LOWTIDE_SIGNAL_REPLAY_FILE=str(_trace(folder)),
        LOWTIDE_SIGNAL_REPLAY_SPEED="1",
        LOWTIDE_SIGNAL_REPLAY_LOOP="false",
        LOWTIDE_SIGNAL_REPLAY_FORECAST_ERROR="0",
        LOWTIDE_COST_DEFER_THRESHOLD=str(THRESHOLD),
        LOWTIDE_COST_DEFERRABLE_ACTIVITIES="train",
        LOWTIDE_LOG_LEVEL="WARNING",
    )
    if feed is not None:
        for key in [k for k in env if k.startswith("LOWTIDE_SIGNAL_REPLAY_")]:
            del env[key]
        env.update(feed)
    env["LOWTIDE_CONFIG"] = str(_config(folder, auth=auth, extra=config))
    if not auth:
        env["LOWTIDE_AUTH"] = "off"
    stack = Stack(env, folder)
    try:
        stack.start("signal", "signal", "serve")
        _serving(signal, 30)
        stack.start("scheduler", "scheduler", "serve")
        _serving(scheduler, 30)
        stack.start("console", "console")
        _answering(stack.url, 30)
    except BaseException:
        stack.stop()
        raise AssertionError(stack.tail()) from None
    return stack


@pytest.fixture
def open_stack(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    """Auth off, as `lowtide up` runs on loopback."""
    stack = start_stack(database_url, tmp_path, auth=False)
    yield stack
    stack.stop()


@pytest.fixture
def guarded_stack(database_url: str, tmp_path: Path, browser: WebDriver) -> Iterator[Stack]:
    """Auth on, with an admin and a viewer token; the browser forgets the last stack's cookie."""
    stack = start_stack(database_url, tmp_path, auth=True)
    browser.delete_all_cookies()
    yield stack
    stack.stop()
