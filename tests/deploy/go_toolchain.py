"""Debian's Go toolchain for the compiled worker in clients/go: what is missing, and its install
(once, after collection, only when the Go worker's test is to run)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.debian import install

GOCODE = Path("/usr/share/gocode/src")
PACKAGES = (
    "golang-go",
    "protobuf-compiler",
    "protoc-gen-go-grpc",
    "golang-google-protobuf-dev",
    "golang-google-grpc-dev",
)
_NOT_INSTALLED: list[str] = []


def missing() -> list[str]:
    """The tools and Go modules build.sh needs that this machine lacks."""
    tools = [tool for tool in ("go", "protoc", "protoc-gen-go-grpc") if shutil.which(tool) is None]
    modules = [
        package
        for package, folder in (
            ("golang-google-protobuf-dev", "google.golang.org/protobuf"),
            ("golang-google-grpc-dev", "google.golang.org/grpc"),
        )
        if not (GOCODE / folder).is_dir()
    ]
    return tools + modules


def ensure() -> None:
    """Installs the toolchain when some of it is missing; remembers why it could not."""
    if missing():
        problem = install(PACKAGES)
        if problem:
            _NOT_INSTALLED.append(problem)


def why_not() -> str | None:
    """Why the Go worker cannot be built here, or None when it can."""
    absent = missing()
    if not absent:
        return None
    tried = f"; installing them failed: {_NOT_INSTALLED[0]}" if _NOT_INSTALLED else ""
    advice = "on Debian: apt-get install " + " ".join(PACKAGES)
    return f"the Go toolchain is not installed (missing: {', '.join(absent)}){tried}; {advice}"


def build_env() -> dict[str, str]:
    """The environment build.sh runs in: Debian's tools, and one Go build cache for every build
    of a run (the worker's and the Go tutorial's compile the same packages)."""
    return {"PATH": "/usr/bin:/bin", "GOCACHE": str(Path(tempfile.gettempdir()) / "lowtide-go-build-cache")}
