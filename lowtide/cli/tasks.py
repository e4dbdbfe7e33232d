"""`lowtide task`: submit, get, cancel, retry, list and explain tasks."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta

from lowtide import output
from lowtide.cli.common import (
    ID,
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
_STATES = {name.removeprefix("TASK_STATE_").lower(): value for name, value in TaskState.items() if value}


def _payload(args: argparse.Namespace, config: Config) -> bytes | str:
    """--payload TEXT, or --payload-file PATH (- for stdin), read no further than the payload
    limit of the configuration ([scheduler] max_payload_bytes) so that a wrong file cannot fill
    memory before the scheduler refuses it."""
    source = args.payload_file
    if source is None:
        return str(args.payload)
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
    return data


def _submit_options(args: argparse.Namespace, idempotency_key: str | None) -> TaskOptions:
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
        "pool": args.pool,
        "start_at": args.start_at,
        "start_in": args.start_in,
        "start_tolerance": args.tolerance,
        "estimated_duration": args.estimated_duration,
        "deadline": args.deadline,
        "latest_start": args.latest_start,
    }
    if args.on_miss:
        options["on_miss"] = args.on_miss.replace("-", "_")
    return options


async def _task_submit(args: argparse.Namespace, config: Config) -> int:
    payload = _payload(args, config)
    key = args.idempotency_key
    async with Client(target(args, config), **security()) as client:
        if args.count > 1:
            # In batches of _BATCH so that a terminal sees the progress; each batch's lines as it lands.
            progress = Progress(args.count, "submitted")
            try:
                for start in range(0, args.count, _BATCH):
                    specs = [
                        task_spec(args.type, payload, **_submit_options(args, f"{key}-{i}" if key else None))
                        for i in range(start, min(start + _BATCH, args.count))
                    ]
                    for item in await client.submit_many(specs, batch_size=_BATCH):
                        show(args, item, f"task {item.id} {'submitted' if item.created else 'exists already'}")
                    progress.advance(len(specs))
            finally:
                progress.end()
            return 0
        task = await client.submit(args.type, payload, **_submit_options(args, key))
        if args.wait and not task.HasField("start_at"):
            task = await client.wait(task.id, timeout=args.wait_timeout)
        show(args, task, output.task_line(task))
    return 0


async def _task_get(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        task = await client.get(args.id)
        show(args, task, output.task_line(task))
    return 0


async def _task_cancel(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        task = await client.cancel(args.id)
        show(args, task, output.task_line(task))
    return 0


async def _task_retry(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        task = await client.retry(args.id, if_attempt=args.if_attempt)
        show(args, task, output.task_line(task))
    return 0


async def _task_list(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        token = ""
        shown = 0
        while shown < args.limit:
            page = await client.list(
                queue=args.queue or "",
                state=_STATES[args.state] if args.state else 0,
                activity_type=args.type or "",
                page_size=min(1000, args.limit - shown),
                page_token=token,
            )
            for task in page.tasks:
                print(output.listed_json(task) if args.json else output.task_line(task, listed=True), flush=True)
            shown += len(page.tasks)
            token = page.next_page_token
            if not token:
                break
    return 0


async def _task_explain(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        response = await client.explain(args.id)
        if args.json:
            data = output.to_dict(response.task)
            data.update(explanation=response.explanation, reasons=list(response.reasons))
            print(json.dumps(data), flush=True)
        else:
            print(f"task {args.id}: {response.explanation}", flush=True)
    return 0


def _add_submit(task_commands: Commands, parents: Parents) -> None:
    submit = task_commands.add_parser("submit", parents=[parents.common, parents.client], help="submit a task")
    submit.add_argument("type", type=not_empty, help="activity type")
    payload = submit.add_mutually_exclusive_group()
    payload.add_argument("--payload", default="", help="payload (text)")
    payload.add_argument(
        "--payload-file",
        metavar="PATH",
        help="payload (bytes) read from a file, or - for stdin; at most [scheduler] max_payload_bytes",
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
    submit.add_argument("--heartbeat-timeout", type=duration, metavar="DURATION")
    submit.add_argument("--max-defer", type=duration, metavar="DURATION", help="longest a cost hold may defer it")
    submit.add_argument("--pool", default="", help="the pool whose capacity a fixed start reserves")
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
    submit.add_argument("--count", type=whole(1, 1_000_000), default=1, help="submit N copies in batches")
    submit.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait for the task to finish before printing it (default: wait up to --wait-timeout)",
    )
    submit.add_argument("--wait-timeout", type=duration, default=timedelta(seconds=10))
    submit.set_defaults(handler=_task_submit)


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide task submit|get|cancel|retry|list|explain`."""
    client = [parents.common, parents.client]
    task = commands.add_parser("task", help="submit and inspect tasks")
    task_commands = task.add_subparsers(dest="task_command", required=True)
    _add_submit(task_commands, parents)
    get = task_commands.add_parser("get", parents=client, help="show a task")
    get.add_argument("id", type=whole(*ID))
    get.set_defaults(handler=_task_get)
    cancel = task_commands.add_parser("cancel", parents=client, help="cancel a task")
    cancel.add_argument("id", type=whole(*ID))
    cancel.set_defaults(handler=_task_cancel)
    retry = task_commands.add_parser(
        "retry", parents=client, help="run a task that failed, timed out, was cancelled or shed again"
    )
    retry.add_argument("id", type=whole(*ID))
    retry.add_argument(
        "--if-attempt",
        type=whole(0, 2**32 - 1),
        metavar="N",
        help="the attempt you saw it end at: run again after the task moved on, it changes nothing and succeeds",
    )
    retry.set_defaults(handler=_task_retry)
    listing = task_commands.add_parser(
        "list", parents=client, help="list tasks, newest first (without payloads and results: see task get)"
    )
    listing.add_argument("--queue")
    listing.add_argument("--state", choices=sorted(_STATES))
    listing.add_argument("--type")
    listing.add_argument("--limit", type=whole(1, ID[1]), default=50)
    listing.set_defaults(handler=_task_list)
    explain = task_commands.add_parser("explain", parents=client, help="why is it pending?")
    explain.add_argument("id", type=whole(*ID))
    explain.set_defaults(handler=_task_explain)
