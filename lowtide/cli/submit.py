"""`lowtide task submit`: one task, or N copies in batches; its payload from text, a file or
stdin, raw or JSON, with headers."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta

import grpc

from lowtide import output
from lowtide.cli.common import (
    INT32,
    Commands,
    Parents,
    duration,
    finite,
    not_empty,
    security,
    show,
    target,
    timestamp,
    whole,
)
from lowtide.cli.progress import Progress
from lowtide.config import Config
from lowtide.errors import InvalidArgument
from lowtide_client import Client, TaskKind, TaskOptions, TaskState, task_spec

_BATCH = 1000  # tasks per SubmitTasks call of `task submit --count N`
_PENDING = TaskState.Value("TASK_STATE_PENDING")
CONTENT_TYPE = "content-type"
JSON = "application/json"


def _payload(args: argparse.Namespace, config: Config) -> bytes | str:
    """--payload TEXT, or --payload-file PATH (- for stdin), read no further than the payload
    limit of the configuration ([scheduler] max_payload_bytes) so that a wrong file cannot fill
    memory before the scheduler refuses it. With --json-payload it must be JSON."""
    source = args.payload_file
    data: bytes | str
    if source is None:
        data = str(args.payload)
    else:
        limit = config.scheduler.max_payload_bytes
        try:
            if source == "-":
                data = sys.stdin.buffer.read(limit + 1)
            else:
                with open(source, "rb") as file:
                    data = file.read(limit + 1)
        except OSError as error:
            raise InvalidArgument("--payload-file", f"cannot read {source}: {error.strerror or error}") from None
        if len(data) > limit:
            where = "stdin" if source == "-" else source
            raise InvalidArgument(
                "--payload-file", f"{where} is over the payload limit of {limit} bytes ([scheduler] max_payload_bytes)"
            )
    if args.json_payload and data:
        try:
            json.loads(data)
        except (UnicodeDecodeError, ValueError) as error:
            field = "--payload" if source is None else "--payload-file"
            raise InvalidArgument(field, f"is not JSON, which --json-payload sends ({error})") from None
    return data


def header(text: str) -> tuple[str, str]:
    """`--header KEY=VALUE`."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. traceparent=00-..., not {text[:80]!r}")
    return key.strip().lower(), value


def _headers(args: argparse.Namespace) -> dict[str, str]:
    """The task's headers: each --header (names are lower case, as gRPC metadata's are), and
    content-type: application/json with --json-payload."""
    headers = dict(args.header or ())
    if args.json_payload:
        given = headers.get(CONTENT_TYPE)
        if given is not None and given.split(";")[0].strip().lower() != JSON:
            raise InvalidArgument("--json-payload", f"sends {CONTENT_TYPE}: {JSON}, but --header says {given!r}")
        headers.setdefault(CONTENT_TYPE, JSON)
    return headers


def _submit_options(args: argparse.Namespace, idempotency_key: str | None) -> TaskOptions:
    pool, pools = _pools(args)
    options: TaskOptions = {
        "idempotency_key": idempotency_key,
        "queue": args.queue,
        "priority": args.priority,
        "kind": TaskKind.Value("TASK_KIND_WORKFLOW") if args.workflow else TaskKind.Value("TASK_KIND_ACTIVITY"),
        "max_attempts": args.max_attempts,
        "initial_backoff": args.initial_backoff,
        "backoff_coefficient": args.backoff_coefficient,
        "max_backoff": args.max_backoff,
        "non_retryable_error_types": args.non_retryable or (),
        "schedule_to_start_timeout": args.schedule_to_start,
        "start_to_close_timeout": args.start_to_close,
        "heartbeat_timeout": args.heartbeat_timeout,
        "max_defer": args.max_defer,
        "pool": pool,
        "pools": pools,
        "start_at": args.start_at,
        "start_in": args.start_in,
        "start_tolerance": args.tolerance,
        "estimated_duration": args.estimated_duration,
        "deadline": args.deadline,
        "latest_start": args.latest_start,
        "headers": _headers(args),
    }
    if args.on_miss:
        options["on_miss"] = args.on_miss.replace("-", "_")
    return options


def _pools(args: argparse.Namespace) -> tuple[str, list[str]]:
    """`--pool`: the pool a fixed start reserves (one), or the pools any other task may run in."""
    named: list[str] = args.pool or []
    if args.start_at is not None or args.start_in is not None:
        if len(named) > 1:
            raise InvalidArgument("--pool", "a fixed start reserves capacity in one pool")
        return (named[0] if named else ""), []
    return "", named


async def _say_if_no_worker(client: Client, task_id: int, which: str) -> None:
    """On stderr, at once: the task waits because no connected worker runs its type (what
    `task explain` says), rather than a `pending` at the end of the wait with no reason."""
    try:
        explained = await client.explain(task_id)
    except grpc.aio.AioRpcError:
        return  # the submit itself worked; saying why it waits is a courtesy
    if "no_worker" in explained.reasons and explained.task.state == _PENDING:
        print(f"lowtide: {which} pending: {explained.explanation}", file=sys.stderr, flush=True)


async def _submit_count(args: argparse.Namespace, client: Client, payload: bytes | str) -> None:
    """N copies in batches of _BATCH, a progress bar on a terminal; then one summary line (the
    ids as ranges), or with --json one object per task."""
    key = args.idempotency_key
    progress = Progress(args.count, "submitted")
    created: list[int] = []
    existing: list[int] = []
    try:
        for start in range(0, args.count, _BATCH):
            specs = [
                task_spec(args.type, payload, **_submit_options(args, f"{key}-{i}" if key else None))
                for i in range(start, min(start + _BATCH, args.count))
            ]
            for item in await client.submit_many(specs, batch_size=_BATCH):
                if args.json:
                    print(output.dumps(item), flush=True)
                (created if item.created else existing).append(item.id)
            progress.advance(len(specs))
    finally:
        progress.end()
    if not args.json:
        summary = f"submitted {len(created):,} task(s) of type {args.type}"
        if created:
            summary += f": ids {output.id_ranges(created)}"
        if existing:
            summary += f"; {len(existing):,} existed already: ids {output.id_ranges(existing)}"
        print(summary, flush=True)
    if created and args.start_at is None and args.start_in is None:
        await _say_if_no_worker(client, created[0], f"tasks of type {args.type} are")


async def _task_submit(args: argparse.Namespace, config: Config) -> int:
    payload = _payload(args, config)
    async with Client(target(args, config), **security()) as client:
        if args.count > 1:
            await _submit_count(args, client, payload)
            return 0
        task = await client.submit(args.type, payload, **_submit_options(args, args.idempotency_key))
        # A fixed start is a promise for later: no worker now is no news (an autoscaler starts
        # them for the reservation as the start nears).
        if task.state == _PENDING and not task.HasField("start_at"):
            await _say_if_no_worker(client, task.id, f"task {task.id} is")
        if args.wait and not task.HasField("start_at"):
            task = await client.wait(task.id, timeout=args.wait_timeout)
        show(args, task, output.task_line(task))
    return 0


def add_submit(task_commands: Commands, parents: Parents) -> None:
    submit = task_commands.add_parser("submit", parents=[parents.common, parents.client], help="submit a task")
    submit.add_argument("type", type=not_empty, help="activity type")
    payload = submit.add_mutually_exclusive_group()
    payload.add_argument("--payload", default="", help="payload (text)")
    payload.add_argument(
        "--payload-file",
        metavar="PATH",
        help="payload (bytes) read from a file, or - for stdin; at most [scheduler] max_payload_bytes",
    )
    submit.add_argument(
        "--json-payload",
        action="store_true",
        help="the payload is JSON: checked here, and sent with the header content-type: application/json "
        "(a JSON worker in any language gets it parsed)",
    )
    submit.add_argument(
        "--header",
        action="append",
        type=header,
        metavar="KEY=VALUE",
        help="a header carried to the worker of every attempt (repeatable)",
    )
    submit.add_argument("--queue", default="default")
    submit.add_argument("--priority", type=whole(*INT32), default=0, help="higher runs first (default 0)")
    submit.add_argument("--workflow", action="store_true", help="submit a workflow task (never held)")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--max-attempts", type=whole(1, INT32[1]), help="1 means never retry")
    submit.add_argument("--initial-backoff", type=duration)
    submit.add_argument("--backoff-coefficient", type=finite)
    submit.add_argument("--max-backoff", type=duration)
    submit.add_argument("--non-retryable", action="append", metavar="ERROR_TYPE")
    submit.add_argument("--schedule-to-start", type=duration, metavar="DURATION")
    submit.add_argument("--start-to-close", type=duration, metavar="DURATION")
    submit.add_argument("--heartbeat-timeout", type=duration, metavar="DURATION", help="at least 1s")
    submit.add_argument("--max-defer", type=duration, metavar="DURATION", help="longest a cost hold may defer it")
    submit.add_argument(
        "--pool",
        action="append",
        metavar="NAME",
        help="a pool the task may run in (repeatable; none: any that runs its type); "
        "for a fixed start, the one pool whose capacity it reserves",
    )
    submit.add_argument("--start-at", type=timestamp, metavar="TIME", help="fixed start, ISO 8601")
    submit.add_argument("--start-in", type=duration, metavar="DURATION", help="fixed start, from now")
    submit.add_argument("--tolerance", type=duration, metavar="DURATION", help="fixed start tolerance (1s)")
    submit.add_argument("--on-miss", choices=("run-late", "skip"), help="fixed start miss policy (run-late)")
    submit.add_argument(
        "--estimated-duration", type=duration, metavar="DURATION", help="for a fixed start or a deadline"
    )
    submit.add_argument(
        "--deadline", type=timestamp, metavar="TIME", help="latest finish of a deferrable task (planned release)"
    )
    submit.add_argument("--latest-start", type=timestamp, metavar="TIME", help="latest start of a deferrable task")
    submit.add_argument(
        "--count",
        type=whole(1, 1_000_000),
        default=1,
        help="submit N copies in batches; prints one summary line (ids as ranges), or with --json one line per task",
    )
    submit.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait for the task to finish before printing it (default: wait up to --wait-timeout)",
    )
    submit.add_argument("--wait-timeout", type=duration, default=timedelta(seconds=10))
    submit.set_defaults(handler=_task_submit)
