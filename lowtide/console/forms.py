"""Every input the console takes, bounded: query parameters and form fields are read through
these, and anything out of bounds is a BadInput whose message names the field and what it
accepts (shown as a 400 page, never a traceback)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from lowtide_proto.lowtide.v1 import task_pb2

# A form body larger than this is refused before it is parsed.
MAX_BODY = 16 * 1024
MAX_NAME = 200
MAX_TOKEN = 4096
MAX_PAGE_TOKEN = 1024
# The task states a list may be filtered by, as the page names them.
STATES = {
    name.removeprefix("TASK_STATE_").lower(): number
    for name, number in task_pb2.TaskState.items()
    if number != task_pb2.TASK_STATE_UNSPECIFIED
}
# Signal values the console accepts: far beyond any grid intensity or price, still finite.
MAX_SIGNAL = 1e9


class BadInput(Exception):
    """An input the console does not accept; the message says which and why."""


def text(values: Mapping[str, str], field: str, *, limit: int = MAX_NAME, required: bool = False) -> str:
    value = values.get(field, "")
    if len(value) > limit:
        raise BadInput(f"{field}: at most {limit} characters, not {len(value)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadInput(f"{field}: must not contain control characters")
    if required and not value.strip():
        raise BadInput(f"{field}: must not be empty")
    return value.strip()


def task_id(raw: str, field: str = "task id") -> int:
    if not raw.isdigit() or len(raw) > 19:
        raise BadInput(f"{field}: must be a whole number from 1 to {2**63 - 1}, not {raw[:40]!r}")
    value = int(raw)
    if not 1 <= value <= 2**63 - 1:
        raise BadInput(f"{field}: must be a whole number from 1 to {2**63 - 1}, not {raw[:40]!r}")
    return value


def attempt(values: Mapping[str, str]) -> int | None:
    """The attempt a page showed its task at (None: the form has none)."""
    raw = values.get("attempt", "")
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 10 or int(raw) > 2**32 - 1:
        raise BadInput(f"attempt: must be a whole number from 0 to {2**32 - 1}, not {raw[:40]!r}")
    return int(raw)


def state(values: Mapping[str, str]) -> int:
    raw = text(values, "state", limit=20)
    if not raw:
        return 0
    if raw not in STATES:
        raise BadInput(f"state: one of {', '.join(STATES)}, not {raw!r}")
    return STATES[raw]


def signal_value(values: Mapping[str, str]) -> float:
    raw = text(values, "value", limit=40, required=True)
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(f"value: not a number: {raw!r}") from None
    if not math.isfinite(value) or abs(value) > MAX_SIGNAL:
        raise BadInput(f"value: a finite number within ±{MAX_SIGNAL:g}, not {raw!r}")
    return value
