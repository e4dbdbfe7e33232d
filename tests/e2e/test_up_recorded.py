"""`lowtide up --demo --recorded` as a user runs it: the demo on the recorded UK week. The live line
shows the values that came that week, and the console draws the forecast the UK API issued, as
issued, with its error band and where that error comes from."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from tests.e2e.test_up import fetch, postmaster_pid, user_env
from tests.helpers import free_port


def _recorded_values() -> set[float]:
    data = resources.files("signal_service.data").joinpath("uk_national_2023-03_actuals.csv").read_text()
    return {float(row["actual"]) for row in csv.DictReader(data.splitlines())}


def test_up_demo_recorded_plays_the_uk_week_and_the_console_draws_its_forecast_as_issued(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = user_env(data_dir, f"127.0.0.1:{free_port()}")
    env.update(LOWTIDE_LOG_LEVEL="WARNING")
    process = subprocess.Popen(
        [sys.executable, "-m", "lowtide", "up", "--demo", "--recorded"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    lines: list[str] = []
    overview = ""
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if len([x for x in lines if x.startswith("signal ")]) >= 3:
                break
        console = f"http://{env['LOWTIDE_CONSOLE_LISTEN']}/"
        while time.monotonic() < deadline:
            overview = fetch(console)
            if 'class="forecast-band"' in overview and "by recorded" in overview:
                break
            time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        pid = postmaster_pid(data_dir / "demo")
        if pid is not None:
            os.kill(pid, signal.SIGQUIT)
    text = "".join(lines)
    assert "feed: recorded" in text and "the UK API's recorded week" in text and "threshold 155" in text, text
    # The live line's values are the ones that came that week.
    shown = [float(m.group(1)) for m in re.finditer(r"^signal\s+([\d.]+) / 155", text, re.M)]
    assert shown and set(shown) <= _recorded_values(), text
    # The console: the forecast as the UK API issued it, its band, and where its error comes from.
    assert 'class="forecast-line"' in overview and 'class="forecast-band"' in overview, overview[-3000:]
    assert "by recorded: drawn dashed as it was issued" in overview
    assert "The error is " in overview and "How sure: ±" in overview
