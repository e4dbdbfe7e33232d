"""Debian's Go toolchain for the compiled worker in clients/go: what is missing, and its install
(once, after collection, only when the Go worker's test is to run)."""

from __future__ import annotations

from soak.go import PACKAGES, build_env, missing
from tests.debian import install

__all__ = ["PACKAGES", "build_env", "ensure", "missing", "why_not"]

_NOT_INSTALLED: list[str] = []


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
