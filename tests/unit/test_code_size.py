"""The house rule on size, kept by a test: no hand-written module of the product over 400 lines and
no function over 80 (generated code and the tests themselves aside)."""

from __future__ import annotations

import ast
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_FOLDERS = ("lowtide", "scheduler_service", "signal_service", "clients/python", "bench", "scripts", "soak")
_GENERATED = ("clients/python/lowtide_proto/lowtide", "clients/python/lowtide_proto/externalscaler")
MODULE_LINES = 400
FUNCTION_LINES = 80


def _modules() -> list[Path]:
    found = []
    for folder in _FOLDERS:
        for path in sorted((_REPO / folder).rglob("*.py")):
            relative = path.relative_to(_REPO).as_posix()
            if not relative.startswith(_GENERATED) and not {"__pycache__", "build"} & set(path.parts):
                found.append(path)
    return found


def test_no_module_is_over_400_lines() -> None:
    modules = _modules()
    assert len(modules) > 100
    long = {
        path.relative_to(_REPO).as_posix(): lines
        for path in modules
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    long = {
        f"{path.relative_to(_REPO).as_posix()}:{node.name}": node.end_lineno - node.lineno + 1
        for path in _modules()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > FUNCTION_LINES
    }
    assert long == {}
