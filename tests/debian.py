"""Debian packages a suite needs (Chromium for the console, Go for the compiled worker), installed
when missing, as CI and a new machine start bare: quietly, as root or through `sudo -n`.

The suite runs in several processes (pytest-xdist), each of which may find a package missing at
once: the install takes a lock first, and looks again under it, so apt runs once."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "lowtide-tests-apt.lock"


def installed(packages: Sequence[str]) -> bool:
    """Whether dpkg has every one of `packages` installed."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status}\n", *packages], capture_output=True, text=True, check=False
    )
    states = done.stdout.split()
    return done.returncode == 0 and len(states) == len(packages) and all(s == "installed" for s in states)


def install(packages: Sequence[str]) -> str | None:
    """`apt-get update` then `apt-get install PACKAGES`, unless another process of the suite did
    so meanwhile; returns why it could not, or None."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sudo = ["sudo", "-n"] if os.geteuid() != 0 and shutil.which("sudo") else []
    steps = (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages])
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("dpkg-query") and installed(packages):
            return None
        for step in steps:
            try:
                done = subprocess.run(
                    [*sudo, *step], env=env, capture_output=True, text=True, timeout=1200, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                return f"{' '.join(step)}: {error}"
            if done.returncode != 0:
                return f"{' '.join(step)} failed:\n{done.stderr[-2000:]}"
    return None
