"""`lowtide task`: submit (lowtide.cli.submit), get, cancel, retry, list and explain tasks."""

from __future__ import annotations

import argparse
import json
import sys

from lowtide import output
from lowtide.cli.common import ID, Commands, Parents, security, show, target, whole
from lowtide.cli.submit import add_submit
from lowtide.config import Config
from lowtide_client import Client, TaskState

_CANCELLED = TaskState.Value("TASK_STATE_CANCELLED")
_STATES = {name.removeprefix("TASK_STATE_").lower(): value for name, value in TaskState.items() if value}


async def _task_get(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        task = await client.get(args.id)
        show(args, task, output.task_line(task))
    return 0


async def _task_cancel(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        task = await client.cancel(args.id)
        show(args, task, output.task_line(task))
    if task.state != _CANCELLED:
        # Cancelling a task that has ended changes nothing: a script must not read success.
        state = TaskState.Name(task.state).removeprefix("TASK_STATE_").lower()
        print(f"lowtide: task {args.id} was not cancelled: it had already ended ({state})", file=sys.stderr, flush=True)
        return 1
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


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide task submit|get|cancel|retry|list|explain`."""
    client = [parents.common, parents.client]
    task = commands.add_parser("task", help="submit and inspect tasks")
    task_commands = task.add_subparsers(dest="task_command", required=True)
    add_submit(task_commands, parents)
    get = task_commands.add_parser("get", parents=client, help="show a task")
    get.add_argument("id", type=whole(*ID))
    get.set_defaults(handler=_task_get)
    cancel = task_commands.add_parser(
        "cancel", parents=client, help="cancel a pending or running task (exit 1 when it had already ended)"
    )
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
