"""`python -m bench`: one JSON object on stdout: lowtide against Procrastinate and PgQueuer on
the same PostgreSQL, then lowtide's own figures (signal fan-out, cost-hold release, claim cost
with a million held rows, carbon saved by planned release over the 2020 GB trace, both services
against hostile HTTP/2 clients, the adaptive concurrency limit against a degrading downstream,
the cost of idle workers and of a steady light load, the drain of issue 15, gRPC's own floor).

Progress and the workers' own warnings go to stderr. The exit status is 1 when a selected
benchmark failed (its entry then holds `error`), 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta

from bench._machine import describe_machine
from bench._pg import DEFAULT_SERVER_URL
from bench.carbon_bench import MODELS as CARBON_MODELS
from bench.carbon_bench import MODES as CARBON_MODES
from lowtide import event_loop

BENCHMARKS = (
    "lowtide",
    "procrastinate",
    "pgqueuer",
    "signal_fanout",
    "hold_release",
    "held_claim",
    "fixed_starts",
    "live_carbon",
    "carbon",
    "hostile",
    "idle",
    "steady",
    "drain",
    "grpc_floor",
    "adaptive_concurrency",
)
PEERS = ("procrastinate", "pgqueuer")


def _default_url() -> str:
    return (
        os.environ.get("LOWTIDE_BENCH_DATABASE_URL")
        or os.environ.get("LOWTIDE_TEST_DATABASE_URL")
        or DEFAULT_SERVER_URL
    )


def _among(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """A comma-separated subset of `choices` (the benchmarks; the carbon evaluation's models or modes)."""

    def parse(value: str) -> list[str]:
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = sorted(set(names) - set(choices))
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}; got {value!r}")
        return names

    return parse


_names = _among(BENCHMARKS)


def _counts(value: str) -> list[int]:
    try:
        counts = [int(n) for n in value.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,4; got {value!r}")
    return counts


def _carbon_sample(parser: argparse.ArgumentParser) -> None:
    """The carbon evaluation's choice of cells and sample, to run one part of it on its own."""
    parser.add_argument(
        "--models",
        type=_among(tuple(CARBON_MODELS)),
        default=list(CARBON_MODELS),
        help=f"the carbon evaluation's error models, a subset of {','.join(CARBON_MODELS)} (default: all)",
    )
    parser.add_argument(
        "--modes",
        type=_among(CARBON_MODES),
        default=list(CARBON_MODES),
        help=f"the carbon evaluation's policies, a subset of {','.join(CARBON_MODES)} (default: all; the oracles and "
        "the threshold hold always run)",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=None,
        help="the carbon evaluation's sample: this many blocks of --days days spread over the trace (default 4 of 14)",
    )
    parser.add_argument("--days", type=int, default=None, help="the days of each block of --blocks (default 14)")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="the learned cells' record starts empty at each block and is learned again every half hour, as a "
        "new deployment's (default: two weeks of record before each block, learned again daily)",
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=_default_url(),
        help="server to benchmark on; each run gets a database of its own, created and dropped "
        "(default: $LOWTIDE_BENCH_DATABASE_URL, $LOWTIDE_TEST_DATABASE_URL or %(default)s)",
    )
    parser.add_argument("--tasks", type=int, default=10_000, help="jobs per run (default %(default)s)")
    parser.add_argument(
        "names",
        nargs="*",
        type=_names,
        help="benchmarks to run, as --only (e.g. `python -m bench carbon --trace FILE`)",
    )
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        help="the carbon evaluation's trace: a CSV `Time,Carbon Intensity`, or a price trace `Time,Price` "
        "(default: the bundled GB 2020 one); given twice or more, one per region aligned in time, the "
        "spatial evaluation also runs over them all (the carbon evaluation on the first)",
    )
    parser.add_argument(
        "--spatial",
        action="store_true",
        help="run the spatial evaluation with the carbon one (~1 h more on 2 cores) even without two --trace: "
        "over the bundled GB and DE 2020 traces when none is given",
    )
    parser.add_argument(
        "--forecasts",
        default="",
        help="with --actuals: the carbon evaluation on recorded forecasts, a CSV `issued_at,target,forecast`",
    )
    parser.add_argument("--actuals", default="", help="with --forecasts: the values that came, a CSV `target,actual`")
    parser.add_argument(
        "--start-after",
        type=float,
        default=0.0,
        help="with --forecasts: the jobs and the calibration's record start this many hours after the first "
        "forecast (how much the cells owe to when the archive begins; default 0)",
    )
    _carbon_sample(parser)
    parser.add_argument(
        "--only",
        type=_names,
        default=list(BENCHMARKS),
        help=f"comma-separated subset of {','.join(BENCHMARKS)} (default: all)",
    )
    parser.add_argument(
        "--processes",
        type=_counts,
        default=[1, 2, 4],
        help="worker-process counts to time each peer with (default 1,2,4)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="times to repeat every run; the best counts (default 1). The drain runs at least "
        "3 rounds and reports their median",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds one run may take before its workers are killed (default %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.names:
        args.only = [n for names in args.names for n in names]
    if (args.blocks is not None and args.blocks < 1) or (args.days is not None and args.days < 1):
        parser.error("--blocks and --days must be at least 1")
    if args.start_after < 0:
        parser.error("--start-after cannot be negative")
    if args.tasks < 1 or args.repeat < 1 or args.timeout <= 0:
        parser.error("--tasks and --repeat must be at least 1, --timeout positive")
    return args


def _carbon(args: argparse.Namespace) -> dict[str, object]:
    """The carbon evaluation: on the recorded forecasts when given, else on a trace's generated ones
    (and the spatial evaluation when asked)."""
    if args.forecasts or args.actuals:
        from bench.recorded_bench import recorded_evaluation

        return recorded_evaluation(
            args.forecasts, args.actuals, modes=args.modes, start_after=timedelta(hours=args.start_after)
        )
    from bench.carbon_bench import BLOCK_DAYS, BLOCKS, carbon_evaluation
    from bench.spatial_bench import BUNDLED, spatial_evaluation

    result = carbon_evaluation(
        args.trace[0] if args.trace else "",
        blocks=args.blocks or BLOCKS,
        days=args.days or BLOCK_DAYS,
        models=args.models,
        modes=args.modes,
        cold=args.cold,
    )
    if len(args.trace) >= 2 or args.spatial:
        result["spatial"] = spatial_evaluation(args.trace if len(args.trace) >= 2 else BUNDLED)
    return result


async def _run_one(name: str, args: argparse.Namespace) -> dict[str, object]:
    # Imported on demand: each peer needs only its own library, so `--only pgqueuer` works
    # without Procrastinate installed and the other way round.
    if name == "lowtide":
        from bench.lowtide_bench import run_lowtide

        return await run_lowtide(args.database_url, args.tasks)
    if name == "signal_fanout":
        from bench.fanout_bench import signal_fanout

        return await signal_fanout(args.database_url)
    if name == "hold_release":
        from bench.holds_bench import hold_release

        return await hold_release(args.database_url)
    if name == "held_claim":
        from bench.holds_bench import held_claim

        return await held_claim(args.database_url)
    if name == "hostile":
        from bench.hostile_bench import hostile

        return await hostile(args.database_url)
    if name == "drain":
        from bench.drain_bench import ROUNDS, drain

        return await drain(args.database_url, timeout_s=args.timeout, rounds=max(ROUNDS, args.repeat))
    if name == "grpc_floor":
        from bench.grpc_floor_bench import grpc_floor

        return await grpc_floor()
    if name == "adaptive_concurrency":
        from bench.adaptive_bench import adaptive_concurrency

        return await adaptive_concurrency(args.database_url, timeout_s=args.timeout)
    if name == "idle":
        from bench.idle_bench import idle_cost

        return await idle_cost(args.database_url)
    if name == "steady":
        from bench.steady_bench import steady

        return await steady(args.database_url)
    if name == "carbon":
        return _carbon(args)
    if name == "live_carbon":
        from bench.live_carbon_bench import live_carbon

        return await live_carbon(args.database_url)
    if name == "fixed_starts":
        from bench.fixed_bench import fixed_precision

        return await fixed_precision(args.database_url)
    if name == "procrastinate":
        from bench.procrastinate_bench import run_procrastinate as run_peer
    else:
        from bench.pgqueuer_bench import run_pgqueuer as run_peer
    return await run_peer(
        args.database_url,
        tasks=args.tasks,
        processes=args.processes,
        repeat=args.repeat,
        timeout_s=args.timeout,
    )


def _ratios(report: dict[str, object]) -> dict[str, float]:
    lowtide = report.get("lowtide")
    if not isinstance(lowtide, dict) or not isinstance(lowtide.get("tasks_per_s"), int | float):
        return {}
    ratios: dict[str, float] = {}
    for peer in PEERS:
        result = report.get(peer)
        if isinstance(result, dict) and isinstance(result.get("best_tasks_per_s"), int | float):
            ratios[f"lowtide_vs_{peer}"] = round(lowtide["tasks_per_s"] / result["best_tasks_per_s"], 3)
    return ratios


async def _main(args: argparse.Namespace) -> int:
    # SIGTERM unwinds like Ctrl-C does (asyncio.run cancels on SIGINT): by cancelling this task,
    # so every `finally` on the way out stops the workers and drops the run's database.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    report: dict[str, object] = {"machine": await describe_machine(args.database_url)}
    report["tasks"] = args.tasks
    status = 0
    # One after another, never side by side: on two cores concurrent runs would measure each other.
    for name in (n for n in BENCHMARKS if n in args.only):
        print(f"[{name}] starting", file=sys.stderr, flush=True)
        try:
            report[name] = await _run_one(name, args)
        except Exception as exc:
            print(f"[{name}] failed: {exc!r}", file=sys.stderr, flush=True)
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            status = 1
    if ratios := _ratios(report):
        report["ratios"] = ratios
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    try:
        # The load generator (firing submits, timing answers) on uvloop, for every system alike: the
        # less it costs, the less it takes from the systems' share of the machine.
        return event_loop.run(_main(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; workers stopped and databases dropped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
