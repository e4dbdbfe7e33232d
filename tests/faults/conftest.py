"""Fixtures of the fault tests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.support import Postgres


@pytest.fixture
def postgres(embedded_data_dir: Path) -> Iterator[Postgres]:
    """A PostgreSQL server of the test's own, which it may stop, kill and start again."""
    server = Postgres(embedded_data_dir)
    try:
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            server.stop()
