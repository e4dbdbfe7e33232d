"""What every command group of the `lowtide` command shares: the argument types, the parent
parsers of the common and client options, the client's security from the environment, and how a
command's error reaches the user (`run`)."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

import grpc

from lowtide import event_loop, output
from lowtide.config import Config, load_config
from lowtide.errors import EXIT_CONFIG, ConfigError, LowtideError
from lowtide_client import parse_duration, reservation_conflict

Handler = Callable[[argparse.Namespace, Config], Coroutine[Any, Any, int]]
# The subcommands of a parser (what `add_subparsers` returns), that a command group adds its commands to.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


@dataclass(frozen=True)
class Parents:
    """The parent parsers of the commands: `common` (--config, --json) for every command,
    `client` (--target, the scheduler's address) for the commands that call the scheduler."""

    common: argparse.ArgumentParser
    client: argparse.ArgumentParser


def parents() -> Parents:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML configuration file (default: $LOWTIDE_CONFIG)")
    common.add_argument("--json", action="store_true", help="machine-readable output, one JSON object per line")
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--target", help="scheduler address (default: [scheduler] listen, 127.0.0.1:50051)")
    return Parents(common=common, client=client)


def duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def timestamp(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r} (e.g. 2026-06-01T12:00:00Z)") from None
    try:
        # A time without an offset is local time; the scheduler gets UTC.
        return (moment if moment.tzinfo else moment.astimezone()).astimezone(UTC)
    except (OverflowError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: in UTC it is not within years 1 to 9999") from None


# The ranges of the proto fields the numbers go into (int32, a positive int64 id).
INT32 = (-(2**31), 2**31 - 1)
ID = (1, 2**63 - 1)


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from low to high, refused by argparse otherwise."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return whole


def finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value


def seconds(text: str) -> float:
    value = finite(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 3600 seconds, not {text}")
    return value


def not_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def target(args: argparse.Namespace, config: Config) -> str:
    return str(args.target or config.scheduler.listen)


def security() -> dict[str, Any]:
    """Token and TLS files for the client commands, from the environment only: a token on the
    command line would show in `ps` and in shell history. LOWTIDE_TOKEN is sent as a bearer
    token; LOWTIDE_CA turns TLS on; LOWTIDE_CERT and LOWTIDE_KEY add a client certificate."""
    names = {"token": "LOWTIDE_TOKEN", "ca": "LOWTIDE_CA", "cert": "LOWTIDE_CERT", "key": "LOWTIDE_KEY"}
    return {option: os.environ[name] for option, name in names.items() if os.environ.get(name)}


# The services plug their `serve(config)` in under this entry-point group (pyproject.toml), so that
# the kernel and the CLI import none of them: the arrows point from the services to lowtide.
SERVICES = "lowtide.services"


async def serve_service(name: str, config: Config) -> int:
    """Runs the named service (`scheduler`, `signal`) until it is stopped."""
    found = importlib.metadata.entry_points(group=SERVICES, name=name)
    if not found:
        raise LowtideError(
            f"the {name} service is not installed with this lowtide (no {name!r} in the {SERVICES} entry points):"
            " reinstall lowtide (pip install lowtide; in a checkout, make .venv/.installed-dev)"
        )
    serve: Callable[[Config], Awaitable[None]] = next(iter(found)).load()
    await serve(config)
    return 0


def show(args: argparse.Namespace, message: Any, human: str) -> None:
    print(output.dumps(message) if args.json else human, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command's handler; its errors become a message on stderr and an exit code."""
    try:
        config = load_config(args.config)
        handler: Handler = args.handler
        return event_loop.run(handler(args, config))
    except LowtideError as error:
        print(f"lowtide: {error}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(error, ConfigError) else 2
    except grpc.aio.AioRpcError as error:
        _rpc_error(args, error)
        return 1
    except BrokenPipeError:
        # The reader went away (`task list | head`): a normal end, said nothing about. Python
        # would otherwise complain again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


def _rpc_error(args: argparse.Namespace, error: grpc.aio.AioRpcError) -> None:
    conflict = reservation_conflict(error)
    if getattr(args, "json", False):
        report: dict[str, Any] = {"code": error.code().name, "message": error.details()}
        if conflict is not None:
            report["reservation_conflict"] = output.to_dict(conflict)
        print(json.dumps({"error": report}), file=sys.stderr)
    else:
        print(f"lowtide: {error.code().name}: {error.details()}", file=sys.stderr)
        if conflict is not None:
            print(output.conflict_text(conflict), file=sys.stderr)
