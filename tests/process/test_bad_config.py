"""A service started with a bad configuration value exits at once (status 78, EX_CONFIG) with one
line that names the key and what it accepts, and no traceback; a misspelt LOWTIDE_ variable is
warned about."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lowtide.errors import EXIT_CONFIG


def _serve(kind: str, env: dict[str, str], config: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "lowtide", kind, "serve", *(["--config", str(config)] if config else [])]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    return subprocess.run(
        args, env={**clean, "LOWTIDE_AUTH": "off", **env}, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("kind", "env", "line"),
    [
        (
            "scheduler",
            {"LOWTIDE_SCHEDULER_LEASE_TIMEOUT": "0s"},
            "lowtide: LOWTIDE_SCHEDULER_LEASE_TIMEOUT ([scheduler] lease_timeout): must be between 1s and 1h, not 0s",
        ),
        (
            "scheduler",
            {"LOWTIDE_SCHEDULER_LISTEN": "127.0.0.1:99999"},
            "lowtide: LOWTIDE_SCHEDULER_LISTEN ([scheduler] listen): must be host:port with a port from 0 to 65535 "
            "(e.g. 127.0.0.1:50051), not '127.0.0.1:99999'",
        ),
        (
            "scheduler",
            {"LOWTIDE_DATABASE_URL": "garbage"},
            "lowtide: LOWTIDE_DATABASE_URL ([database] url): not a PostgreSQL URL (postgresql://user@host:5432/dbname) "
            'or key=value string: missing "=" after "garbage" in connection info string',
        ),
        (
            "scheduler",
            {"LOWTIDE_EVENT_LOOP": "trio"},
            "lowtide: LOWTIDE_EVENT_LOOP: must be one of uvloop, asyncio, not 'trio'",
        ),
        (
            "signal",
            {"LOWTIDE_COST_DEFER_THRESHOLD": "nan"},
            "lowtide: LOWTIDE_COST_DEFER_THRESHOLD ([cost] defer_threshold): must be a finite number, not nan",
        ),
    ],
)
def test_a_service_with_a_bad_value_exits_with_one_line(kind: str, env: dict[str, str], line: str) -> None:
    done = _serve(kind, env)
    assert done.returncode == EXIT_CONFIG
    assert done.stderr.strip() == line
    assert "Traceback" not in done.stderr + done.stdout


def test_a_file_that_is_not_utf8_or_not_toml_is_one_line(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.toml"
    latin.write_bytes(b'[signal]\nunit = "\xb5g"\n')
    done = _serve("scheduler", {}, latin)
    assert (done.returncode, done.stderr.strip()) == (
        EXIT_CONFIG,
        f"lowtide: config file {latin}: not UTF-8 text (byte 0xb5 at offset 17)",
    )
    broken = tmp_path / "broken.toml"
    broken.write_text("[database]\npool_min = 8\npool_max = 4\n[scheduler\n")
    done = _serve("scheduler", {}, broken)
    assert done.returncode == EXIT_CONFIG
    assert done.stderr.startswith(f"lowtide: config file {broken}: not valid TOML: ")
    assert done.stderr.count("\n") == 1
    broken.write_text("[database]\npool_min = 8\npool_max = 4\n")
    done = _serve("scheduler", {}, broken)
    assert done.stderr == (
        "lowtide: [database] pool_max: must be at least [database] pool_min (8), not 4: "
        "the pool cannot keep more connections than it may open\n"
    )


def test_a_misspelt_variable_is_warned_about_with_the_key_it_resembles() -> None:
    # The lease error ends the process before it needs a database; the warning comes first.
    typo = {"LOWTIDE_SCHEDULER_LISTNE": "0.0.0.0:6000", "LOWTIDE_LOG_LEVEL": "INFO"}
    done = _serve("scheduler", {**typo, "LOWTIDE_SCHEDULER_LEASE_TIMEOUT": "1s"})
    warning, error = done.stderr.strip().splitlines()
    assert "warning lowtide.config config.unknown_variable variable=LOWTIDE_SCHEDULER_LISTNE" in warning
    assert "did_you_mean=LOWTIDE_SCHEDULER_LISTEN" in warning
    assert error.startswith("lowtide: LOWTIDE_SCHEDULER_LEASE_TIMEOUT ([scheduler] lease_timeout): must be at least")
