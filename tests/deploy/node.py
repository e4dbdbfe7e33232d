"""The Node.js worker library in clients/node: its dependencies installed once with `npm ci`
(from package-lock.json), and node processes run bounded."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
# Written after a successful `npm ci`: the hash of the lock file it installed.
STAMP = NODE_DIR / "node_modules" / ".lowtide-lock-sha256"
# Held while `npm ci` runs: the suite's processes (pytest-xdist) install one at a time; two at
# once, on a fresh clone, emptied each other's node_modules.
INSTALLING = NODE_DIR / ".npm-ci.lock"


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("Node.js 20 (node and npm) is not installed")
    return node


async def run_bounded(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, within: float
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *args,
        cwd=cwd,
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
    return process.returncode, out.decode(), err.decode()


async def ensure_node_modules() -> None:
    """`npm ci` unless node_modules already holds exactly what package-lock.json names."""
    node_or_skip()
    lock = hashlib.sha256((NODE_DIR / "package-lock.json").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == lock:
        return
    with INSTALLING.open("w") as installing:
        # Bounded: the process holding it runs `npm ci` for at most 300 s.
        await asyncio.to_thread(fcntl.flock, installing, fcntl.LOCK_EX)
        if STAMP.exists() and STAMP.read_text().strip() == lock:
            return  # installed by another process meanwhile
        code, out, err = await run_bounded(
            "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", cwd=NODE_DIR, within=300
        )
        assert code == 0, f"npm ci failed ({code}):\n{out}\n{err}"
        STAMP.write_text(lock)
