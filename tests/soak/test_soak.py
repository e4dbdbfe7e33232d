"""The short soak `make test` runs: the real services, Python and Node workers, a load of every
kind of work and faults drawn from a fixed seed for about a minute and a half, then every
invariant judged (`make soak` runs a longer one; docs/explanation/soak.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEED = 41


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_short_soak_breaks_no_promise() -> None:
    # Not tmp_path: the soak's embedded PostgreSQL keeps its data in its folder, and run as root
    # the server is another user, which must traverse every folder above it. Any pytest session
    # that starts meanwhile takes that access off pytest's root folder (`pytest-of-USER`), and the
    # soak's next start of PostgreSQL (initdb, or a restart after a fault) fails with "Permission
    # denied" (as tests/conftest.py's embedded_data_dir explains for the fault tests). Kept when
    # the test fails, for its logs and records.
    out = Path(tempfile.mkdtemp(prefix="lowtide-test-soak-"))
    command = [sys.executable, "-m", "soak", "--duration", "80s", "--seed", str(SEED), "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}\n(logs and records in {out})"
    summary = (out / "summary.txt").read_text()
    assert "soak passed: 0 violation(s)" in summary, f"{summary}\n(logs and records in {out})"
    # It did break things: faults were injected, and work got done through them.
    assert "faults injected: 0 " not in summary
    assert "tasks completed" in summary
    shutil.rmtree(out, ignore_errors=True)
