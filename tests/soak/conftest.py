"""The short soak runs a Go worker where Debian's Go toolchain is here: installed once, after
collection, when the soak is to run (as for the Go worker's own test, tests/deploy/conftest.py)."""

from __future__ import annotations

import pytest

from tests.deploy import go_toolchain


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if any(item.path.name == "test_soak.py" for item in items):
        go_toolchain.ensure()
