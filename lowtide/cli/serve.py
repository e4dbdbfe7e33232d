"""`lowtide up` (everything on one machine), `lowtide scheduler serve` and `lowtide console`."""

from __future__ import annotations

import argparse
import sys

from lowtide.cli.common import Commands, Parents, serve_service
from lowtide.config import Config


async def _up(args: argparse.Namespace, config: Config) -> int:
    from lowtide.up import run_up

    if args.recorded and not args.demo:
        print(
            'lowtide up: --recorded is for the demo (--demo --recorded); else set [signal] feed = "recorded"',
            file=sys.stderr,
        )
        return 2
    return await run_up(config, demo=args.demo, recorded=args.recorded)


async def _scheduler_serve(args: argparse.Namespace, config: Config) -> int:
    return await serve_service("scheduler", config)


async def _console(args: argparse.Namespace, config: Config) -> int:
    from dataclasses import replace

    from lowtide.console.server import serve_console

    if args.listen:
        config = replace(config, console=replace(config.console, listen=args.listen))
    await serve_console(config)
    return 0


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide up [--demo]`, `lowtide scheduler serve` and `lowtide console`."""
    up = commands.add_parser("up", parents=[parents.common], help="run lowtide (embedded PostgreSQL unless configured)")
    up.add_argument(
        "--demo", action="store_true", help="replayed grid trace, demo workers and a task generator, shown live"
    )
    up.add_argument(
        "--recorded",
        action="store_true",
        help="with --demo: the recorded UK week (the forecasts the UK API issued, and the values that came)",
    )
    up.set_defaults(handler=_up)

    scheduler = commands.add_parser("scheduler", help="the scheduler service")
    scheduler_commands = scheduler.add_subparsers(dest="scheduler_command", required=True)
    serve = scheduler_commands.add_parser(
        "serve", parents=[parents.common], help="serve the scheduler (needs a database)"
    )
    serve.set_defaults(handler=_scheduler_serve)

    console = commands.add_parser(
        "console",
        parents=[parents.common],
        help="the web console on [console] listen (127.0.0.1:8080), a client of both services",
    )
    console.add_argument("--listen", type=_listen, help="host:port to serve on (default: [console] listen)")
    console.set_defaults(handler=_console)


def _listen(text: str) -> str:
    from lowtide.config import listen_address

    problem = listen_address(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text
