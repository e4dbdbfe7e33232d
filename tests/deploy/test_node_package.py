"""The Node library as a user gets it: `npm pack` holds the protos it loads and its type
declarations, the tarball installs into an empty folder (its dependencies from the registry), and
the installed package's example worker runs a task against a real scheduler."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from datetime import timedelta
from pathlib import Path

from lowtide_client import Client, TaskState
from scheduler_service.server import Scheduler
from tests.deploy.node import NODE_DIR, node_or_skip, run_bounded

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


async def test_the_packed_library_installs_into_an_empty_folder_and_runs_its_example(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    node = node_or_skip()
    package = json.loads((NODE_DIR / "package.json").read_text())
    assert "private" not in package and package["types"] == "index.d.ts"
    # Its metadata: license, repository, homepage and issues (the README and LICENSE are packed below).
    assert package["license"] == "Apache-2.0"
    assert {"repository", "homepage", "bugs"} <= set(package)
    code, out, err = await run_bounded(
        "npm", "pack", "--json", "--pack-destination", str(tmp_path), cwd=NODE_DIR, within=120
    )
    assert code == 0, f"npm pack failed ({code}):\n{out}\n{err}"
    (packed,) = json.loads(out)
    files = {entry["path"] for entry in packed["files"]}
    protos = {f"protos/lowtide/v1/{name}.proto" for name in ("worker", "scheduler", "task", "schedule")}
    assert protos | {"index.d.ts", "lib/index.js", "example/worker.js", "package.json", "README.md", "LICENSE"} <= files
    assert not any(path.startswith(("test/", "node_modules/")) for path in files)

    folder = tmp_path / "empty"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LOWTIDE_PROTO_DIR"}
    code, out, err = await run_bounded(
        "npm", "install", "--no-audit", "--no-fund", "--loglevel=error", str(tmp_path / packed["filename"]),
        cwd=folder, env=env, within=300,
    )  # fmt: skip
    assert code == 0, f"npm install of the tarball failed ({code}):\n{out}\n{err}"
    example = folder / "node_modules" / package["name"] / "example" / "worker.js"
    worker = await asyncio.create_subprocess_exec(
        node,
        str(example),
        cwd=folder,
        env={**env, "LOWTIDE_TARGET": scheduler.target, "LOWTIDE_ACTIVITY_TYPES": "upper"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with Client(scheduler.target) as client:
            task = await client.submit("upper", b"from the tarball")
            done = await client.wait(task.id, timeout=timedelta(seconds=30))
        assert (done.state, done.result) == (COMPLETED, b"FROM THE TARBALL")
        worker.send_signal(signal.SIGTERM)
        out_bytes, err_bytes = await asyncio.wait_for(worker.communicate(), 30)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, err_bytes.decode()
    assert "connected to" in out_bytes.decode()


async def test_the_library_required_from_a_checkout_without_npm_ci_says_to_run_it(tmp_path: Path) -> None:
    """`require('./clients/node/lib')` in a checkout where `npm ci` has not been run: one error
    that names the missing dependency and what to run where, not "Cannot find module"."""
    node = node_or_skip()
    checkout = tmp_path / "clients" / "node"
    checkout.mkdir(parents=True)
    for part in ("lib", "protos"):
        shutil.copytree(NODE_DIR / part, checkout / part)
    shutil.copy(NODE_DIR / "package.json", checkout)
    code, out, err = await run_bounded(node, "-e", "require('./clients/node/lib')", cwd=tmp_path, within=60)
    assert code == 1, (out, err)
    assert "its dependency @grpc/grpc-js is not installed" in err
    assert f"Run `npm ci` once in {checkout}" in err
