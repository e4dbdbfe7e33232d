"""`lowtide status` (queues, pools, holds, carbon) and `lowtide health` (a service's gRPC health)."""

from __future__ import annotations

import argparse
import json
import sys

from lowtide import output
from lowtide.cli.common import Commands, Parents, seconds, security, target
from lowtide.config import Config
from lowtide_client import Client


async def _status(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        status = await client.status()
    if args.json:
        print(output.dumps(status), flush=True)
        return 0
    print(output.status_text(status), flush=True)
    return 0


async def _health(args: argparse.Namespace, config: Config) -> int:
    from lowtide.health import check_health
    from lowtide_proto.channel import Security

    if args.http:
        from lowtide.health import check_http

        answer = await check_http(args.http, within=args.timeout)
        print(answer.message, flush=True, file=sys.stdout if answer.serving else sys.stderr)
        return 0 if answer.serving else 1
    address = str(args.target or config.scheduler.listen)
    answer = await check_health(address, args.service, within=args.timeout, security=Security(**security()))
    if args.json:
        print(json.dumps({"serving": answer.serving, "message": answer.message}), flush=True)
    else:
        print(answer.message, flush=True, file=sys.stdout if answer.serving else sys.stderr)
    return 0 if answer.serving else 1


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide status` and `lowtide health`."""
    status = commands.add_parser(
        "status", parents=[parents.common, parents.client], help="queues, pools, holds, carbon"
    )
    status.set_defaults(handler=_status)

    health = commands.add_parser(
        "health", parents=[parents.common], help="gRPC health check of a service: exit 0 when SERVING, 1 otherwise"
    )
    health.add_argument("--target", help="service address (default: [scheduler] listen, 127.0.0.1:50051)")
    health.add_argument(
        "--service", default="", help="a service name, e.g. lowtide.v1.SignalService (default: the whole server)"
    )
    health.add_argument(
        "--http", metavar="URL", type=_http_url, help="check an HTTP URL instead (the web console): exit 0 on 200"
    )
    health.add_argument(
        "--timeout", type=seconds, default=3.0, help="seconds to wait for the answer, at most 3600 (default 3)"
    )
    health.set_defaults(handler=_health)


def _http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text) > 2000:
        raise argparse.ArgumentTypeError(f"not an http:// or https:// URL: {text[:80]!r}")
    return text
