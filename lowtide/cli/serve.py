"""`lowtide up` (everything on one machine) and `lowtide scheduler serve`."""

from __future__ import annotations

import argparse

from lowtide.cli.common import Commands, Parents
from lowtide.config import Config


async def _up(args: argparse.Namespace, config: Config) -> int:
    from lowtide.up import run_up

    return await run_up(config, demo=args.demo)


async def _scheduler_serve(args: argparse.Namespace, config: Config) -> int:
    from scheduler_service.server import serve

    await serve(config)
    return 0


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide up [--demo]` and `lowtide scheduler serve`."""
    up = commands.add_parser("up", parents=[parents.common], help="run lowtide (embedded PostgreSQL unless configured)")
    up.add_argument(
        "--demo", action="store_true", help="replayed grid trace, demo workers and a task generator, shown live"
    )
    up.set_defaults(handler=_up)

    scheduler = commands.add_parser("scheduler", help="the scheduler service")
    scheduler_commands = scheduler.add_subparsers(dest="scheduler_command", required=True)
    serve = scheduler_commands.add_parser(
        "serve", parents=[parents.common], help="serve the scheduler (needs a database)"
    )
    serve.set_defaults(handler=_scheduler_serve)
