"""The Go tutorial (docs/tutorials/worker-go.md) as a reader follows it: its types pasted above
the activities map of clients/go/worker/main.go and its activities inside it, the worker built by
build.sh, run against a real scheduler, and given the tutorial's tasks: `shout` from the
command line and the typed `area` by the tutorial's Python program. Needs Debian's Go toolchain,
installed like the Go worker's own test (tests/deploy/go_toolchain.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from scheduler_service.server import Scheduler
from tests.deploy import go_toolchain
from tests.deploy.node import run_bounded
from tests.docs.blocks import ROOT, block_run_by

PAGE = "docs/tutorials/worker-go.md"
THIS = "tests/deploy/test_go_tutorial.py"
MAP = "var activities = map[string]func([]byte) ([]byte, error){\n"


def with_the_tutorials_activities(main_go: str) -> str:
    types, entries = block_run_by(THIS, PAGE, "go")
    assert main_go.count(MAP) == 1, "the tutorial names a line main.go no longer has"
    before, after = main_go.split(MAP)
    return before + types.text + "\n" + MAP + entries.text + after


async def test_the_go_tutorial_activities_build_and_run(scheduler: Scheduler, tmp_path: Path) -> None:
    problem = go_toolchain.why_not()
    if problem:
        pytest.skip(problem)
    # build.sh finds protos/ two folders up, as in the checkout.
    (tmp_path / "protos").symlink_to(ROOT / "protos")
    go = tmp_path / "clients" / "go"
    (go / "worker").mkdir(parents=True)
    shutil.copy(ROOT / "clients" / "go" / "build.sh", go / "build.sh")
    main_go = (ROOT / "clients" / "go" / "worker" / "main.go").read_text()
    (go / "worker" / "main.go").write_text(with_the_tutorials_activities(main_go))
    code, out, err = await run_bounded(
        str(go / "build.sh"), "./my-worker", cwd=go, env=go_toolchain.build_env(), within=300
    )
    assert code == 0, f"build.sh failed ({code}):\n{out}\n{err}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    worker = await asyncio.create_subprocess_exec(
        str(go / "my-worker"),
        env={"LOWTIDE_TARGET": scheduler.target, "LOWTIDE_SLOTS": "8"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 30)
        assert f"connected to {scheduler.target}".encode() in line, line
        cli = ["-m", "lowtide", "task", "submit", "shout", "--payload", "hello", "--json"]
        listen = {**env, "LOWTIDE_SCHEDULER_LISTEN": scheduler.target}
        code, out, err = await run_bounded(sys.executable, *cli, cwd=tmp_path, env=listen, within=60)
        assert code == 0, err
        assert json.loads(out)["result"] == "HELLO", out
        (program,) = block_run_by(THIS, PAGE, "python")
        (tmp_path / "area.py").write_text(program.text)
        target = {**env, "LOWTIDE_TARGET": scheduler.target}
        code, out, err = await run_bounded(sys.executable, "area.py", cwd=tmp_path, env=target, within=60)
        assert code == 0, err
        assert out.strip() == "Area(area=6)", out
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 30) == 0
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
