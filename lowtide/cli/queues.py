"""`lowtide queue`: pause and resume a queue."""

from __future__ import annotations

import argparse

from lowtide.cli.common import Commands, Parents, security, show, target
from lowtide.config import Config
from lowtide_client import Client


async def _queue(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        if args.queue_command == "pause":
            queue = await client.pause_queue(args.name, create=args.create)
        else:
            queue = await client.resume_queue(args.name)
        show(args, queue, f"queue {queue.name} {'paused' if queue.paused else 'running'}")
    return 0


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide queue pause|resume NAME`."""
    queue = commands.add_parser("queue", help="pause and resume queues")
    queue_commands = queue.add_subparsers(dest="queue_command", required=True)
    for verb, text in (("pause", "stop claims from a queue (its schedule_to_start timers stop)"), ("resume", "resume")):
        command = queue_commands.add_parser(verb, parents=[parents.common, parents.client], help=text)
        command.add_argument("name")
        if verb == "pause":
            command.add_argument(
                "--create",
                action="store_true",
                help="pause a queue no task was submitted to yet (without it, an unknown name is refused)",
            )
        command.set_defaults(handler=_queue)
