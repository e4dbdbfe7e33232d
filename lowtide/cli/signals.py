"""`lowtide signal`: serve the cost signal, set it, show it and watch it change."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from lowtide import output
from lowtide.cli.common import Commands, Parents, finite, security, serve_service
from lowtide.config import Config
from lowtide.forecast_replay import JOB_SLACKS, windowed
from lowtide_client import SignalClient


async def _signal_serve(args: argparse.Namespace, config: Config) -> int:
    return await serve_service("signal", config)


def _signal_client(args: argparse.Namespace, config: Config) -> SignalClient:
    return SignalClient(str(args.target or config.signal.listen), **security())


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


async def _signal_list(args: argparse.Namespace, config: Config) -> int:
    async with _signal_client(args, config) as client:
        for state in await client.list():
            _show_signal(args, state)
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
            *_errors(points),
        ]
    print(" ".join(parts), flush=True)


def _errors(points: Any) -> list[str]:
    """Each point's expected error, at a few leads from the first point: `error@6h=12%(prior)`."""
    first = points[0].at.ToDatetime()
    shown = []
    for hours in (1, 6, 24):
        target = first + timedelta(hours=hours)
        point = min(points, key=lambda p: abs(p.at.ToDatetime() - target))
        if abs(point.at.ToDatetime() - target) > timedelta(hours=1) or not point.HasField("expected_error"):
            continue
        source = f"({point.error_source})" if point.error_source else ""
        shown.append(f"error@{hours}h={100 * point.expected_error:.0f}%{source}".replace(" ", "_"))
    return shown


async def _signal_forecast(args: argparse.Namespace, config: Config) -> int:
    async with _signal_client(args, config) as client:
        response = await client.forecast_issued(args.signal)
    name = args.signal or config.cost.signal
    if args.json:
        _show_forecast(args, name, response)
        return 0
    header = [name, "forecast", f"from={response.source or '-'}", f"version={response.version}"]
    if response.HasField("issued_at"):
        header.append(f"issued={_time(response.issued_at)}")
    header.append(f"points={len(response.points)}")
    if response.HasField("calibration"):
        learned = response.calibration
        record = f"learned over {learned.days:.1f} days" if learned.days else "the prior's"
        day = windowed(learned.caution, learned.caution_slope, JOB_SLACKS[-1])
        by_window = f" for a 4 h window, {day:.2g} for 24 h" if learned.caution_slope else ""
        header.append(f"caution={learned.caution:g} ({record}{by_window})")
    if not response.points:
        header.append("(the feed gives no forecast now)")
    print(" ".join(header), flush=True)
    for point in response.points:
        line = [_time(point.at), f"{point.value:g}"]
        if point.HasField("expected_error"):
            line.append(f"error={100 * point.expected_error:.1f}%")
        if point.HasField("bias"):
            line.append(f"bias={100 * point.bias:+.1f}%")
        if point.error_source:
            line.append(f"({point.error_source})")
        print(" ".join(line), flush=True)
    return 0


def _time(stamp: Any) -> str:
    return f"{stamp.ToDatetime().isoformat()}Z"


async def _signal_watch(args: argparse.Namespace, config: Config) -> int:
    async with _signal_client(args, config) as client:
        # A restart of the signal service (UNAVAILABLE) is waited out, not the end of the
        # watch; a state (or forecast) seen before the restart is not printed again. A reader
        # that goes away (`watch | head`) ends it (common.run).
        last_version = 0
        async for update in client.updates(args.signal, reconnect=True):
            if update.state.version > last_version:
                last_version = update.state.version
                _show_signal(args, update.state)
            if args.forecast and update.HasField("forecast"):
                _show_forecast(args, update.state.name, update.forecast)
    return 0


def register(commands: Commands, parents: Parents) -> None:
    """`lowtide signal serve|set|get|list|forecast|watch`."""
    common = parents.common
    signal_target = argparse.ArgumentParser(add_help=False)
    signal_target.add_argument("--target", help="signal service address (default: [signal] listen, 127.0.0.1:50052)")
    signal_target.add_argument("--signal", default="", help="signal name (default: [cost] signal, grid)")
    signal = commands.add_parser("signal", help="the cost signal")
    signal_commands = signal.add_subparsers(dest="signal_command", required=True)
    signal_serve = signal_commands.add_parser("serve", parents=[common], help="serve the signal (needs a database)")
    signal_serve.set_defaults(handler=_signal_serve)
    signal_set = signal_commands.add_parser("set", parents=[common, signal_target], help="set the signal's value")
    signal_set.add_argument("value", type=finite)
    signal_set.add_argument("--unit", default="", help="refused unless it is the signal's unit")
    signal_set.set_defaults(handler=_signal_set)
    signal_get = signal_commands.add_parser("get", parents=[common, signal_target], help="show the signal")
    signal_get.set_defaults(handler=_signal_get)
    service_target = argparse.ArgumentParser(add_help=False)
    service_target.add_argument("--target", help="signal service address (default: [signal] listen, 127.0.0.1:50052)")
    signal_list = signal_commands.add_parser(
        "list", parents=[common, service_target], help="show every signal: value, unit, threshold, source"
    )
    signal_list.set_defaults(handler=_signal_list)
    forecast = signal_commands.add_parser(
        "forecast",
        parents=[common, signal_target],
        help="show the feed's latest forecast: each point with its expected error and where that comes from",
    )
    forecast.set_defaults(handler=_signal_forecast)
    watch = signal_commands.add_parser("watch", parents=[common, signal_target], help="print each change as it comes")
    watch.add_argument("--forecast", action="store_true", help="also print each new forecast the feed issues")
    watch.set_defaults(handler=_signal_watch)
