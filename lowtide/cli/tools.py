"""`lowtide token hash` (a token's sha256 for [auth] tokens) and `lowtide demo-worker`."""

from __future__ import annotations

import argparse
import sys

from lowtide.cli.common import INT32, Commands, Parents, security, target, whole
from lowtide.config import Config
from lowtide.demo_worker import ACTIVITIES as DEMO_ACTIVITIES


async def _token_hash(args: argparse.Namespace, config: Config) -> int:
    from lowtide.auth import hash_token

    # The token comes from stdin so that it is not in shell history; one trailing newline (from
    # `echo` or a file) is not part of it.
    token = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    if not token:
        print("lowtide: no token on stdin", file=sys.stderr)
        return 2
    print(hash_token(token), flush=True)
    return 0


async def _demo_worker(args: argparse.Namespace, config: Config) -> int:
    from lowtide.demo_worker import run_demo_worker

    await run_demo_worker(
        target=target(args, config),
        pool=args.pool,
        queues=args.queues.split(","),
        types=args.types.split(","),
        slots=args.slots,
        worker_id=args.worker_id,
        security=security(),
    )
    return 0


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide token hash` and `lowtide demo-worker`."""
    token = commands.add_parser("token", help="tokens for [auth] tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    token_hash = token_commands.add_parser(
        "hash", parents=[parents.common], help="print the sha256 of the token read from stdin, for [auth] tokens"
    )
    token_hash.set_defaults(handler=_token_hash)

    demo = commands.add_parser(
        "demo-worker",
        parents=[parents.common, parents.client],
        help=f"run a built-in worker ({', '.join(DEMO_ACTIVITIES)})",
    )
    demo.add_argument("--slots", type=whole(1, INT32[1]), default=10)
    demo.add_argument("--pool", default="default")
    demo.add_argument("--queues", default="default", help="comma-separated")
    demo.add_argument("--types", default=",".join(DEMO_ACTIVITIES), help="comma-separated (default: all of them)")
    demo.add_argument("--worker-id")
    demo.set_defaults(handler=_demo_worker)
