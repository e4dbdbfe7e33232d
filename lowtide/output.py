"""How the CLI shows proto messages: JSON objects with the proto's own snake_case field names
(`--json`, one object per line), or short human lines.

In JSON, enum values are written short and lower case (`"state": "completed"`), and bytes fields
as text when they are valid UTF-8; otherwise as base64, with `<field>_encoding: "base64"` beside.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

_ENUM_PREFIXES = {"state": "TASK_STATE_", "kind": "TASK_KIND_"}
_BYTES_FIELDS = ("payload", "result")


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


def dumps(message: Message) -> str:
    return json.dumps(to_dict(message), sort_keys=False)


def task_line(task: Any) -> str:
    """One human line for a task."""
    state = to_dict(task)["state"]
    parts = [f"task {task.id}", state, f"type={task.activity_type}", f"queue={task.queue}"]
    parts.append(f"attempt={task.attempt}")
    if state == "completed":
        parts.append(f"result={_show(task.result)}")
    if task.HasField("last_failure") and state != "completed":
        parts.append(f"error={task.last_failure.error_type}: {task.last_failure.message}")
    return " ".join(parts)


def _show(raw: bytes) -> str:
    try:
        return repr(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return f"<{len(raw)} bytes>"
