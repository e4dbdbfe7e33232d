"""Debian packages a suite needs (Chromium for the console, Go for the compiled worker), installed
when missing, as CI and a new machine start bare: quietly, as root or through `sudo -n`."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


def install(packages: Sequence[str]) -> str | None:
    """`apt-get update` then `apt-get install PACKAGES`; returns why it could not, or None."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sudo = ["sudo", "-n"] if os.geteuid() != 0 and shutil.which("sudo") else []
    steps = (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages])
    for step in steps:
        try:
            done = subprocess.run([*sudo, *step], env=env, capture_output=True, text=True, timeout=1200, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{' '.join(step)}: {error}"
        if done.returncode != 0:
            return f"{' '.join(step)} failed:\n{done.stderr[-2000:]}"
    return None
