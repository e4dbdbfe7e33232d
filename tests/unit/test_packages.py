"""The package boundaries: the services reach the protocol through lowtide_proto's public modules,
never through lowtide_client's insides, and the two client-side distributions need grpcio and
protobuf only."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_PROTO = _REPO / "clients" / "python-proto"
_CLIENT = _REPO / "clients" / "python"


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _python_files(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _requirements(pyproject: Path) -> set[str]:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in dependencies}


def test_no_service_test_or_benchmark_imports_a_private_module_of_the_client() -> None:
    places = [_REPO / p for p in ("lowtide", "scheduler_service", "signal_service", "bench", "tests")]
    private = [
        f"{path.relative_to(_REPO)}: {name}"
        for path in _python_files(*places)
        for name in _imports(path)
        if name.startswith("lowtide_client.") and name.split(".")[1].startswith("_")
    ]
    assert private == []


def test_the_protocol_package_needs_grpcio_and_protobuf_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"grpc", "google", "lowtide_proto"}
    foreign = {
        f"{path.relative_to(_REPO)}: {name}"
        for path in _python_files(_PROTO / "lowtide_proto")
        for name in _imports(path)
        if name.split(".")[0] not in allowed
    }
    assert foreign == set()
    assert _requirements(_PROTO / "pyproject.toml") == {"grpcio", "protobuf"}


def test_the_client_needs_the_protocol_package_grpcio_and_protobuf_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"grpc", "google", "lowtide_proto", "lowtide_client"}
    foreign = {
        f"{path.relative_to(_REPO)}: {name}"
        for path in _python_files(_CLIENT / "lowtide_client")
        for name in _imports(path)
        if name.split(".")[0] not in allowed
    }
    assert foreign == set()
    assert _requirements(_CLIENT / "pyproject.toml") == {"grpcio", "protobuf", "lowtide-proto"}
