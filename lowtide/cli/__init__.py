"""The `lowtide` command: one module per command group, each adding its commands to the parser
(`register`); what they share (argument types, parent parsers, error handling) is in `common`."""

from __future__ import annotations

import argparse
import importlib.metadata

from lowtide.cli import common, completion, queues, schedules, serve, signals, status, tasks, tools
from lowtide.logs import configure_logging


def _version() -> str:
    try:
        return importlib.metadata.version("lowtide")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parents = common.parents()
    parser = argparse.ArgumentParser(prog="lowtide", description="A cost-aware task scheduler.")
    parser.add_argument("--version", action="version", version=f"lowtide {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    # In this order in `lowtide --help`.
    for group in (serve, signals, tasks, queues, schedules, status, tools):
        group.register(commands, parents)
    completion.register(commands, parents, parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging()
    return common.run(args)
