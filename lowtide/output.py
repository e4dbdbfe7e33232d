"""How the CLI shows proto messages: JSON objects with the proto's own snake_case field names
(`--json`, one object per line), or short human lines.

In JSON, enum values are written short and lower case (`"state": "completed"`), and bytes fields
as text when they are valid UTF-8; otherwise as base64, with `<field>_encoding: "base64"` beside.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

_ENUM_PREFIXES = {"state": "TASK_STATE_", "kind": "TASK_KIND_"}
_BYTES_FIELDS = ("payload", "result", "heartbeat_details")


def print_line(text: str) -> None:
    """Prints one line in a single write: services started together (`lowtide up`) share one
    stdout, and `print` writes the text and its newline apart, which can interleave them when
    stdout is unbuffered (PYTHONUNBUFFERED)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def to_dict(message: Message) -> dict[str, Any]:
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _tidy(message, data)


def _tidy(message: Message, data: dict[str, Any]) -> dict[str, Any]:
    for key, prefix in _ENUM_PREFIXES.items():
        value = data.get(key)
        if isinstance(value, str) and value.startswith(prefix):
            data[key] = value.removeprefix(prefix).lower()
    for key in _BYTES_FIELDS:
        if key in data and hasattr(message, key):
            raw: bytes = getattr(message, key)
            try:
                data[key] = raw.decode("utf-8")
            except UnicodeDecodeError:
                data[key] = base64.b64encode(raw).decode()
                data[f"{key}_encoding"] = "base64"
    for key in ("id",):
        if isinstance(data.get(key), str) and data[key].isdigit():
            data[key] = int(data[key])
    return data


def id_ranges(ids: list[int], *, most: int = 10) -> str:
    """Task ids as ranges, `1-5000, 5003, 5007-10002`; past `most` ranges, how many more (a
    summary line stays one line; `--json` lists every id)."""
    spans: list[tuple[int, int]] = []
    for task_id in sorted(ids):
        if spans and task_id == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], task_id)
        else:
            spans.append((task_id, task_id))
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in spans[:most]]
    if len(spans) > most:
        shown.append(f"and {len(spans) - most:,} more ranges")
    return ", ".join(shown)


def dumps(message: Message) -> str:
    return json.dumps(to_dict(message), sort_keys=False)


def task_line(task: Any, *, listed: bool = False) -> str:
    """One human line for a task; a listed task carries no result (lists leave results out)."""
    state = to_dict(task)["state"]
    parts = [f"task {task.id}", state, f"type={task.activity_type}", f"queue={task.queue}"]
    if task.pools:
        parts.append(f"pools={','.join(task.pools)}")
        if task.planned_pool:
            parts.append(f"planned_pool={task.planned_pool}")
    parts.append(f"attempt={task.attempt}")
    if state == "completed":
        parts.append(f"result=(not in lists: lowtide task get {task.id})" if listed else f"result={_show(task.result)}")
    if task.HasField("last_failure") and state != "completed":
        parts.append(f"error={task.last_failure.error_type}: {task.last_failure.message}")
    if task.heartbeat_details and not listed:
        parts.append(f"heartbeat_details={_show(task.heartbeat_details)}")
    return " ".join(parts)


def listed_json(task: Any) -> str:
    """A listed task in JSON: lists carry no payload or result, so those fields are left out
    rather than shown empty."""
    data = to_dict(task)
    for key in _BYTES_FIELDS:
        data.pop(key, None)
        data.pop(f"{key}_encoding", None)
    return json.dumps(data)


def _show(raw: bytes) -> str:
    try:
        return repr(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return f"<{len(raw)} bytes>"


def _hold_line(hold: Any, named_types: bool) -> str:
    value = f"{hold.value:g}" if hold.HasField("value") else "no value yet"
    types = f" for {', '.join(hold.types) or 'no configured type'}" if named_types else ""
    return (
        f"cost hold{types}: {'ACTIVE' if hold.active else 'off'} (signal {hold.signal}: {value}, "
        f"threshold {hold.threshold:g}{', stale' if hold.stale else ''}) - {hold.reason}"
    )


def status_text(status: Any) -> str:
    """`lowtide status` for people: the hold, then queues, pools, adaptive limits and carbon."""
    # One line per signal some work follows (a scheduler from before that sends only `hold`).
    lines = [_hold_line(hold, len(status.holds) > 1) for hold in (status.holds or [status.hold])]
    lines += [
        "",
        f"{'queue':<16}{'paused':>8}{'depth':>8}{'oldest':>9}{'held':>8}{'oldest held':>13}{'running':>9}  held types",
    ]
    for q in status.queues:
        lines.append(
            f"{q.name:<16}{'yes' if q.paused else 'no':>8}{q.depth:>8}{q.oldest_pending_age_seconds:>8.1f}s"
            f"{q.held_depth:>8}{q.oldest_held_age_seconds:>12.1f}s{q.running:>9}  {','.join(q.held_types) or '-'}"
        )
    lines += [
        "",
        f"{'pool':<16}{'workers':>8}{'slots':>8}{'busy':>8}{'held':>8}{'reserved ahead':>16}{'hit rate':>10}"
        f"{'desired':>9}",
    ]
    for p in status.pools:
        hit = "-" if math.isnan(p.fixed_start_hit_rate) else f"{p.fixed_start_hit_rate:.1%}"
        lines.append(
            f"{p.name:<16}{p.workers:>8}{p.slots:>8}{p.busy_slots:>8}{p.held_slots:>8}{p.reservations_ahead:>16}"
            f"{hit:>10}{p.desired_workers:>9}{_pool_signal(p)}"
        )
    if status.adaptive_limits:
        lines += [
            "",
            f"{'adaptive type':<20}{'limit':>7}{'bounds':>11}{'running':>9}{'latency':>10}{'failure':>9}  why",
        ]
        for a in status.adaptive_limits:
            latency = "-" if math.isnan(a.latency_seconds) else f"{a.latency_seconds * 1000:.0f}ms"
            bounds = f"{a.min}-{a.max}"
            lines.append(
                f"{a.activity_type:<20}{a.limit:>7}{bounds:>11}{a.running:>9}{latency:>10}{a.failure_rate:>9.1%}"
                f"  {a.reason}"
            )
    if status.carbon:
        lines += ["", f"{'deferrable type':<20}{'tasks':>8}{'at submit':>12}{'at dispatch':>13}{'avoided':>10}"]
        for c in status.carbon:
            avoided = c.mean_at_submit - c.mean_at_dispatch
            lines.append(
                f"{c.activity_type:<20}{c.tasks:>8}{c.mean_at_submit:>12.1f}{c.mean_at_dispatch:>13.1f}{avoided:>10.1f}"
            )
    return "\n".join(lines)


def conflict_text(conflict: Any) -> str:
    """A refused fixed start, for people."""

    def at(stamp: Any) -> str:
        return str(stamp.ToDatetime().isoformat()) + "Z"

    ids = ", ".join(str(i) for i in conflict.conflicting_task_ids) or "-"
    return (
        f"  pool:      {conflict.pool} (at most {conflict.capacity} overlapping reservation(s))\n"
        f"  requested: {at(conflict.window_start)} .. {at(conflict.window_end)}\n"
        f"  conflict:  {at(conflict.conflict_start)} .. {at(conflict.conflict_end)} (tasks {ids})"
    )


def _pool_signal(pool: Any) -> str:
    """After a pool bound to a signal: the signal, its value, and the tasks placed there."""
    if not pool.signal:
        return ""
    value = f" {pool.signal_value:g}" if pool.HasField("signal_value") else " (no value yet)"
    return f"  signal {pool.signal}{value}, {pool.planned_releases} planned"
