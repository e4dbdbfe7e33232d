"""`lowtide schedule`: recurring schedules of fixed-start tasks."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lowtide import output
from lowtide.cli.common import INT32, Commands, Parents, duration, not_empty, security, target, whole
from lowtide.config import Config
from lowtide_client import Client


def _schedule_json(schedule: Any) -> str:
    data = output.to_dict(schedule)
    # 64-bit integers are strings in proto's JSON mapping; these are counted and compared as numbers.
    data.update(last_task_id=schedule.last_task_id, conflicts=schedule.conflicts)
    return json.dumps(data)


def _schedule_line(schedule: Any) -> str:
    def at(stamp: Any) -> str:
        return str(stamp.ToDatetime().isoformat()) + "Z"

    parts = [
        f"schedule {schedule.name}",
        "paused" if schedule.paused else "active",
        f"cron={schedule.cron!r}",
        f"tz={schedule.time_zone}",
        f"type={schedule.activity_type}",
        f"pool={schedule.pool}",
    ]
    if not schedule.paused:
        parts.append(f"next={at(schedule.next_fire_at)}")
    if schedule.last_task_id:
        parts.append(f"last_task={schedule.last_task_id}")
    parts.append(f"conflicts={schedule.conflicts}")
    line = " ".join(parts)
    if schedule.last_conflict:
        line += f"\n  last conflict: {schedule.last_conflict}"
    return line


async def _schedule(args: argparse.Namespace, config: Config) -> int:
    async with Client(target(args, config), **security()) as client:
        verb = args.schedule_command
        if verb == "create":
            on_miss = args.on_miss.replace("-", "_") if args.on_miss else "run_late"
            created = await client.create_schedule(
                args.name,
                args.cron,
                args.type,
                args.payload,
                time_zone=args.tz,
                queue=args.queue,
                pool=args.pool,
                priority=args.priority,
                start_tolerance=args.tolerance,
                on_miss=on_miss,
                estimated_duration=args.estimated_duration,
            )
            print(_schedule_json(created) if args.json else _schedule_line(created), flush=True)
        elif verb == "list":
            for listed in await client.list_schedules():
                print(_schedule_json(listed) if args.json else _schedule_line(listed), flush=True)
        elif verb == "resume":
            resumed = await client.resume_schedule(args.name)
            print(_schedule_json(resumed) if args.json else _schedule_line(resumed), flush=True)
        else:
            done = await (client.pause_schedule if verb == "pause" else client.delete_schedule)(args.name)
            ids = list(done.cancelled_task_ids)
            if args.json:
                data = json.loads(_schedule_json(done.schedule))
                print(json.dumps({**data, "cancelled_task_ids": ids}), flush=True)
            else:
                cancelled = f"; cancelled {len(ids)} task(s) not yet started: {', '.join(map(str, ids))}" if ids else ""
                print(f"schedule {args.name} {'paused' if verb == 'pause' else 'deleted'}{cancelled}", flush=True)
    return 0


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide schedule create|list|pause|resume|delete`."""
    client = [parents.common, parents.client]
    schedule = commands.add_parser("schedule", help="recurring schedules of fixed-start tasks")
    schedule_commands = schedule.add_subparsers(dest="schedule_command", required=True)
    create = schedule_commands.add_parser(
        "create", parents=client, help="each fire time of a cron expression becomes a fixed-start task"
    )
    create.add_argument("name")
    create.add_argument("--cron", required=True, help="five fields: minute hour day-of-month month day-of-week")
    create.add_argument("--tz", default="UTC", help="IANA time zone the cron expression is read in (UTC)")
    create.add_argument("--type", type=not_empty, required=True, help="activity type of the tasks")
    create.add_argument("--queue", default="default")
    create.add_argument("--pool", default="", help="the pool whose capacity each occurrence reserves")
    create.add_argument("--payload", default="", help="payload (text)")
    create.add_argument("--priority", type=whole(*INT32), default=0)
    create.add_argument("--tolerance", type=duration, metavar="DURATION", help="start tolerance (1s)")
    create.add_argument("--on-miss", choices=("run-late", "skip"), help="miss policy (run-late)")
    create.add_argument("--estimated-duration", type=duration, metavar="DURATION")
    create.set_defaults(handler=_schedule)
    schedule_list = schedule_commands.add_parser("list", parents=client, help="list schedules")
    schedule_list.set_defaults(handler=_schedule)
    for verb, text in (
        ("pause", "stop creating tasks (and cancel those not yet started)"),
        ("resume", "create tasks again, from the next fire time"),
        ("delete", "delete a schedule (and cancel its tasks not yet started)"),
    ):
        command = schedule_commands.add_parser(verb, parents=client, help=text)
        command.add_argument("name")
        command.set_defaults(handler=_schedule)
