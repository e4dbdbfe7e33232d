"""The tutorials' code, run as a reader would run it: the worker and the submitter of the Node
tutorial (docs/tutorials/worker-node.md) written to files and run by node against a real
scheduler, with the package installed under its own name; the Python tutorial's program
(docs/tutorials/worker-python.md) run by this Python. What the pages say they print is checked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from scheduler_service.server import Scheduler
from tests.deploy.node import NODE_DIR, ensure_node_modules, node_or_skip, run_bounded
from tests.docs.blocks import block_run_by

THIS = "tests/docs/test_tutorials.py"


def _env(scheduler: Scheduler) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    return {**env, "LOWTIDE_TARGET": scheduler.target}


async def test_the_node_tutorial_worker_runs_what_the_tutorial_submits(scheduler: Scheduler, tmp_path: Path) -> None:
    node = node_or_skip()
    await ensure_node_modules()
    worker_js, submit_js = block_run_by(THIS, "docs/tutorials/worker-node.md", "js")
    # `npm install lowtide-worker-0.1.0.tgz` puts the package in node_modules under its name.
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "lowtide-worker").symlink_to(NODE_DIR)
    (tmp_path / "worker.js").write_text(worker_js.text)
    (tmp_path / "submit.js").write_text(submit_js.text)
    env = _env(scheduler)
    worker = await asyncio.create_subprocess_exec(
        node, "worker.js", cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 30)
        assert line.startswith(b"connected as "), line
        # Step 4 from the command line: a plain payload reaches `shout` as a Buffer.
        cli = ["-m", "lowtide", "task", "submit", "shout", "--payload", "hello", "--json"]
        listen = {**env, "LOWTIDE_SCHEDULER_LISTEN": scheduler.target}
        code, out, err = await run_bounded(sys.executable, *cli, cwd=tmp_path, env=listen, within=60)
        assert code == 0, err
        assert json.loads(out)["result"] == "HELLO", out
        # Step 4 from Node: what the page says it prints.
        code, out, err = await run_bounded(node, "submit.js", cwd=tmp_path, env=env, within=60)
        assert code == 0, err
        assert out.strip() == "TASK_STATE_COMPLETED { loss: 0.025 }", out
        # Ctrl-C: the worker stops by itself.
        worker.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(worker.wait(), 30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
        await worker.wait()


async def test_the_python_tutorial_program_prints_its_model(scheduler: Scheduler, tmp_path: Path) -> None:
    (program,) = block_run_by(THIS, "docs/tutorials/worker-python.md", "python")
    (tmp_path / "train.py").write_text(program.text)
    code, out, err = await run_bounded(sys.executable, "train.py", cwd=tmp_path, env=_env(scheduler), within=60)
    assert code == 0, err
    assert out.strip() == "Model(loss=0.025)", out
