"""The `lowtide` command."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import math
import os
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from lowtide import output
from lowtide.config import Config, load_config
from lowtide.demo_worker import ACTIVITIES as DEMO_ACTIVITIES
from lowtide.errors import EXIT_CONFIG, ConfigError, InvalidArgument, LowtideError
from lowtide.logs import configure_logging
from lowtide_client import Client, SignalClient, TaskKind, TaskState, parse_duration, reservation_conflict, task_spec

_STATES = {name.removeprefix("TASK_STATE_").lower(): value for name, value in TaskState.items() if value}


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _timestamp(text: str) -> datetime:
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
_INT32 = (-(2**31), 2**31 - 1)
_ID = (1, 2**63 - 1)


def _whole(low: int, high: int) -> Callable[[str], int]:
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


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value


def _seconds(text: str) -> float:
    value = _finite(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 3600 seconds, not {text}")
    return value


def _not_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


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


def _version() -> str:
    try:
        return importlib.metadata.version("lowtide")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def _target(args: argparse.Namespace, config: Config) -> str:
    return str(args.target or config.scheduler.listen)


def _security() -> dict[str, Any]:
    """Token and TLS files for the client commands, from the environment only: a token on the
    command line would show in `ps` and in shell history. LOWTIDE_TOKEN is sent as a bearer
    token; LOWTIDE_CA turns TLS on; LOWTIDE_CERT and LOWTIDE_KEY add a client certificate."""
    names = {"token": "LOWTIDE_TOKEN", "ca": "LOWTIDE_CA", "cert": "LOWTIDE_CERT", "key": "LOWTIDE_KEY"}
    return {option: os.environ[name] for option, name in names.items() if os.environ.get(name)}


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


def _print(args: argparse.Namespace, message: Any, human: str) -> None:
    print(output.dumps(message) if args.json else human, flush=True)


async def _task_submit(args: argparse.Namespace, config: Config) -> int:
    options: dict[str, Any] = {
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
        "on_miss": args.on_miss.replace("-", "_") if args.on_miss else 0,
        "estimated_duration": args.estimated_duration,
        "deadline": args.deadline,
        "latest_start": args.latest_start,
    }
    payload = _payload(args, config)
    async with Client(_target(args, config), **_security()) as client:
        if args.count > 1:
            specs = [
                task_spec(
                    args.type,
                    payload,
                    idempotency_key=f"{args.idempotency_key}-{i}" if args.idempotency_key else None,
                    **options,
                )
                for i in range(args.count)
            ]
            submitted = await client.submit_many(specs)
            for item in submitted:
                _print(args, item, f"task {item.id} {'submitted' if item.created else 'exists already'}")
            return 0
        task = await client.submit(args.type, payload, idempotency_key=args.idempotency_key, **options)
        if args.wait and not task.HasField("start_at"):
            task = await client.wait(task.id, timeout=args.wait_timeout)
        _print(args, task, output.task_line(task))
    return 0


async def _task_get(args: argparse.Namespace, config: Config) -> int:
    async with Client(_target(args, config), **_security()) as client:
        task = await client.get(args.id)
        _print(args, task, output.task_line(task))
    return 0


async def _task_cancel(args: argparse.Namespace, config: Config) -> int:
    async with Client(_target(args, config), **_security()) as client:
        task = await client.cancel(args.id)
        _print(args, task, output.task_line(task))
    return 0


async def _task_list(args: argparse.Namespace, config: Config) -> int:
    async with Client(_target(args, config), **_security()) as client:
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
    async with Client(_target(args, config), **_security()) as client:
        response = await client.explain(args.id)
        if args.json:
            data = output.to_dict(response.task)
            data.update(explanation=response.explanation, reasons=list(response.reasons))
            print(json.dumps(data), flush=True)
        else:
            print(f"task {args.id}: {response.explanation}", flush=True)
    return 0


async def _queue(args: argparse.Namespace, config: Config) -> int:
    async with Client(_target(args, config), **_security()) as client:
        if args.queue_command == "pause":
            queue = await client.pause_queue(args.name)
        else:
            queue = await client.resume_queue(args.name)
        _print(args, queue, f"queue {queue.name} {'paused' if queue.paused else 'running'}")
    return 0


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
    async with Client(_target(args, config), **_security()) as client:
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


async def _status(args: argparse.Namespace, config: Config) -> int:
    async with Client(_target(args, config), **_security()) as client:
        status = await client.status()
    if args.json:
        print(output.dumps(status), flush=True)
        return 0
    print(output.status_text(status), flush=True)
    return 0


async def _demo_worker(args: argparse.Namespace, config: Config) -> int:
    from lowtide.demo_worker import run_demo_worker

    await run_demo_worker(
        target=_target(args, config),
        pool=args.pool,
        queues=args.queues.split(","),
        types=args.types.split(","),
        slots=args.slots,
        worker_id=args.worker_id,
        security=_security(),
    )
    return 0


async def _scheduler_serve(args: argparse.Namespace, config: Config) -> int:
    from scheduler_service.server import serve

    await serve(config)
    return 0


async def _signal_serve(args: argparse.Namespace, config: Config) -> int:
    from signal_service.server import serve

    await serve(config)
    return 0


def _signal_client(args: argparse.Namespace, config: Config) -> SignalClient:
    return SignalClient(str(args.target or config.signal.listen), **_security())


def _show_signal(args: argparse.Namespace, state: Any) -> None:
    if args.json:
        data = output.to_dict(state)
        # uint64 is a string in proto's JSON mapping; a version is compared as a number.
        data["version"] = state.version
        print(json.dumps(data), flush=True)
        return
    value = f"{state.value:g} {state.unit}" if state.HasField("value") else f"no value yet ({state.unit})"
    parts = [state.name, value, "high" if state.high else "low", f"threshold={state.threshold:g}"]
    if state.HasField("observed_at"):
        parts.append(f"observed_at={state.observed_at.ToDatetime().isoformat()}Z")
    parts += [f"source={state.source or '-'}", f"version={state.version}"]
    if state.stale:
        parts.append("STALE")
    print(" ".join(parts), flush=True)


async def _signal_set(args: argparse.Namespace, config: Config) -> int:
    async with _signal_client(args, config) as client:
        _show_signal(args, await client.set(args.value, name=args.signal, unit=args.unit))
    return 0


async def _signal_get(args: argparse.Namespace, config: Config) -> int:
    async with _signal_client(args, config) as client:
        _show_signal(args, await client.get(args.signal))
    return 0


def _show_forecast(args: argparse.Namespace, name: str, forecast: Any) -> None:
    if args.json:
        data = output.to_dict(forecast)
        data["version"] = forecast.version
        print(json.dumps({"signal": name, "forecast": data}), flush=True)
        return
    parts = [name, "forecast", f"from={forecast.source or '-'}", f"version={forecast.version}"]
    points = forecast.points
    if not points:
        parts.append("no points (the feed gives no forecast now)")
    else:
        low = min(points, key=lambda p: p.value)
        parts += [
            f"points={len(points)}",
            f"{points[0].at.ToDatetime().isoformat()}Z..{points[-1].at.ToDatetime().isoformat()}Z",
            f"lowest={low.value:g} at {low.at.ToDatetime().isoformat()}Z",
        ]
    print(" ".join(parts), flush=True)


async def _signal_watch(args: argparse.Namespace, config: Config) -> int:
    async with _signal_client(args, config) as client:
        # A restart of the signal service (UNAVAILABLE) is waited out, not the end of the
        # watch; a state (or forecast) seen before the restart is not printed again. A reader
        # that goes away (`watch | head`) ends it (main).
        last_version = 0
        async for update in client.updates(args.signal, reconnect=True):
            if update.state.version > last_version:
                last_version = update.state.version
                _show_signal(args, update.state)
            if args.forecast and update.HasField("forecast"):
                _show_forecast(args, update.state.name, update.forecast)
    return 0


async def _health(args: argparse.Namespace, config: Config) -> int:
    from lowtide.health import check_health
    from lowtide_proto.channel import Security

    target = str(args.target or config.scheduler.listen)
    answer = await check_health(target, args.service, within=args.timeout, security=Security(**_security()))
    if args.json:
        print(json.dumps({"serving": answer.serving, "message": answer.message}), flush=True)
    else:
        print(answer.message, flush=True, file=sys.stdout if answer.serving else sys.stderr)
    return 0 if answer.serving else 1


async def _up(args: argparse.Namespace, config: Config) -> int:
    from lowtide.up import run_up

    return await run_up(config, demo=args.demo)


Handler = Callable[[argparse.Namespace, Config], Coroutine[Any, Any, int]]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML configuration file (default: $LOWTIDE_CONFIG)")
    common.add_argument("--json", action="store_true", help="machine-readable output, one JSON object per line")
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--target", help="scheduler address (default: [scheduler] listen, 127.0.0.1:50051)")

    parser = argparse.ArgumentParser(prog="lowtide", description="A cost-aware task scheduler.")
    parser.add_argument("--version", action="version", version=f"lowtide {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", parents=[common], help="run lowtide (embedded PostgreSQL unless configured)")
    up.add_argument(
        "--demo", action="store_true", help="replayed grid trace, demo workers and a task generator, shown live"
    )
    up.set_defaults(handler=_up)

    scheduler = commands.add_parser("scheduler", help="the scheduler service")
    scheduler_commands = scheduler.add_subparsers(dest="scheduler_command", required=True)
    serve = scheduler_commands.add_parser("serve", parents=[common], help="serve the scheduler (needs a database)")
    serve.set_defaults(handler=_scheduler_serve)

    signal_target = argparse.ArgumentParser(add_help=False)
    signal_target.add_argument("--target", help="signal service address (default: [signal] listen, 127.0.0.1:50052)")
    signal_target.add_argument("--signal", default="", help="signal name (default: [cost] signal, grid)")
    signal = commands.add_parser("signal", help="the cost signal")
    signal_commands = signal.add_subparsers(dest="signal_command", required=True)
    signal_serve = signal_commands.add_parser("serve", parents=[common], help="serve the signal (needs a database)")
    signal_serve.set_defaults(handler=_signal_serve)
    signal_set = signal_commands.add_parser("set", parents=[common, signal_target], help="set the signal's value")
    signal_set.add_argument("value", type=_finite)
    signal_set.add_argument("--unit", default="", help="refused unless it is the signal's unit")
    signal_set.set_defaults(handler=_signal_set)
    signal_get = signal_commands.add_parser("get", parents=[common, signal_target], help="show the signal")
    signal_get.set_defaults(handler=_signal_get)
    watch = signal_commands.add_parser("watch", parents=[common, signal_target], help="print each change as it comes")
    watch.add_argument("--forecast", action="store_true", help="also print each new forecast the feed issues")
    watch.set_defaults(handler=_signal_watch)

    task = commands.add_parser("task", help="submit and inspect tasks")
    task_commands = task.add_subparsers(dest="task_command", required=True)
    submit = task_commands.add_parser("submit", parents=[common, client], help="submit a task")
    submit.add_argument("type", type=_not_empty, help="activity type")
    payload = submit.add_mutually_exclusive_group()
    payload.add_argument("--payload", default="", help="payload (text)")
    payload.add_argument(
        "--payload-file",
        metavar="PATH",
        help="payload (bytes) read from a file, or - for stdin; at most [scheduler] max_payload_bytes",
    )
    submit.add_argument("--queue", default="default")
    submit.add_argument("--priority", type=_whole(*_INT32), default=0, help="higher runs first (default 0)")
    submit.add_argument("--workflow", action="store_true", help="submit a workflow task (never held)")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--max-attempts", type=_whole(1, _INT32[1]), help="1 means never retry")
    submit.add_argument("--initial-backoff", type=_duration)
    submit.add_argument("--backoff-coefficient", type=_finite)
    submit.add_argument("--max-backoff", type=_duration)
    submit.add_argument("--non-retryable", action="append", metavar="ERROR_TYPE")
    submit.add_argument("--schedule-to-start", type=_duration, metavar="DURATION")
    submit.add_argument("--start-to-close", type=_duration, metavar="DURATION")
    submit.add_argument("--heartbeat-timeout", type=_duration, metavar="DURATION")
    submit.add_argument("--max-defer", type=_duration, metavar="DURATION", help="longest a cost hold may defer it")
    submit.add_argument("--pool", default="", help="the pool whose capacity a fixed start reserves")
    submit.add_argument("--start-at", type=_timestamp, metavar="TIME", help="fixed start, ISO 8601")
    submit.add_argument("--start-in", type=_duration, metavar="DURATION", help="fixed start, from now")
    submit.add_argument("--tolerance", type=_duration, metavar="DURATION", help="fixed start tolerance (1s)")
    submit.add_argument("--on-miss", choices=("run-late", "skip"), help="fixed start miss policy (run-late)")
    submit.add_argument(
        "--estimated-duration", type=_duration, metavar="DURATION", help="for a fixed start or a deadline"
    )
    submit.add_argument(
        "--deadline", type=_timestamp, metavar="TIME", help="latest finish of a deferrable task (planned release)"
    )
    submit.add_argument("--latest-start", type=_timestamp, metavar="TIME", help="latest start of a deferrable task")
    submit.add_argument("--count", type=_whole(1, 1_000_000), default=1, help="submit N copies in batches")
    submit.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait for the task to finish before printing it (default: wait up to --wait-timeout)",
    )
    submit.add_argument("--wait-timeout", type=_duration, default=timedelta(seconds=10))
    submit.set_defaults(handler=_task_submit)
    get = task_commands.add_parser("get", parents=[common, client], help="show a task")
    get.add_argument("id", type=_whole(*_ID))
    get.set_defaults(handler=_task_get)
    cancel = task_commands.add_parser("cancel", parents=[common, client], help="cancel a task")
    cancel.add_argument("id", type=_whole(*_ID))
    cancel.set_defaults(handler=_task_cancel)
    listing = task_commands.add_parser(
        "list", parents=[common, client], help="list tasks, newest first (without payloads and results: see task get)"
    )
    listing.add_argument("--queue")
    listing.add_argument("--state", choices=sorted(_STATES))
    listing.add_argument("--type")
    listing.add_argument("--limit", type=_whole(1, _ID[1]), default=50)
    listing.set_defaults(handler=_task_list)
    explain = task_commands.add_parser("explain", parents=[common, client], help="why is it pending?")
    explain.add_argument("id", type=_whole(*_ID))
    explain.set_defaults(handler=_task_explain)

    queue = commands.add_parser("queue", help="pause and resume queues")
    queue_commands = queue.add_subparsers(dest="queue_command", required=True)
    for verb, text in (("pause", "stop claims from a queue (its schedule_to_start timers stop)"), ("resume", "resume")):
        command = queue_commands.add_parser(verb, parents=[common, client], help=text)
        command.add_argument("name")
        command.set_defaults(handler=_queue)

    schedule = commands.add_parser("schedule", help="recurring schedules of fixed-start tasks")
    schedule_commands = schedule.add_subparsers(dest="schedule_command", required=True)
    create = schedule_commands.add_parser(
        "create", parents=[common, client], help="each fire time of a cron expression becomes a fixed-start task"
    )
    create.add_argument("name")
    create.add_argument("--cron", required=True, help="five fields: minute hour day-of-month month day-of-week")
    create.add_argument("--tz", default="UTC", help="IANA time zone the cron expression is read in (UTC)")
    create.add_argument("--type", type=_not_empty, required=True, help="activity type of the tasks")
    create.add_argument("--queue", default="default")
    create.add_argument("--pool", default="", help="the pool whose capacity each occurrence reserves")
    create.add_argument("--payload", default="", help="payload (text)")
    create.add_argument("--priority", type=_whole(*_INT32), default=0)
    create.add_argument("--tolerance", type=_duration, metavar="DURATION", help="start tolerance (1s)")
    create.add_argument("--on-miss", choices=("run-late", "skip"), help="miss policy (run-late)")
    create.add_argument("--estimated-duration", type=_duration, metavar="DURATION")
    create.set_defaults(handler=_schedule)
    schedule_list = schedule_commands.add_parser("list", parents=[common, client], help="list schedules")
    schedule_list.set_defaults(handler=_schedule)
    for verb, text in (
        ("pause", "stop creating tasks (and cancel those not yet started)"),
        ("resume", "create tasks again, from the next fire time"),
        ("delete", "delete a schedule (and cancel its tasks not yet started)"),
    ):
        command = schedule_commands.add_parser(verb, parents=[common, client], help=text)
        command.add_argument("name")
        command.set_defaults(handler=_schedule)

    status = commands.add_parser("status", parents=[common, client], help="queues, pools, holds, carbon")
    status.set_defaults(handler=_status)

    health = commands.add_parser(
        "health", parents=[common], help="gRPC health check of a service: exit 0 when SERVING, 1 otherwise"
    )
    health.add_argument("--target", help="service address (default: [scheduler] listen, 127.0.0.1:50051)")
    health.add_argument(
        "--service", default="", help="a service name, e.g. lowtide.v1.SignalService (default: the whole server)"
    )
    health.add_argument(
        "--timeout", type=_seconds, default=3.0, help="seconds to wait for the answer, at most 3600 (default 3)"
    )
    health.set_defaults(handler=_health)

    token = commands.add_parser("token", help="tokens for [auth] tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    token_hash = token_commands.add_parser(
        "hash", parents=[common], help="print the sha256 of the token read from stdin, for [auth] tokens"
    )
    token_hash.set_defaults(handler=_token_hash)

    demo = commands.add_parser(
        "demo-worker", parents=[common, client], help=f"run a built-in worker ({', '.join(DEMO_ACTIVITIES)})"
    )
    demo.add_argument("--slots", type=_whole(1, _INT32[1]), default=10)
    demo.add_argument("--pool", default="default")
    demo.add_argument("--queues", default="default", help="comma-separated")
    demo.add_argument("--types", default=",".join(DEMO_ACTIVITIES), help="comma-separated (default: all of them)")
    demo.add_argument("--worker-id")
    demo.set_defaults(handler=_demo_worker)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging()
    try:
        config = load_config(args.config)
        handler: Handler = args.handler
        return asyncio.run(handler(args, config))
    except LowtideError as error:
        print(f"lowtide: {error}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(error, ConfigError) else 2
    except grpc.aio.AioRpcError as error:
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
        return 1
    except BrokenPipeError:
        # The reader went away (`task list | head`): a normal end, said nothing about. Python
        # would otherwise complain again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
