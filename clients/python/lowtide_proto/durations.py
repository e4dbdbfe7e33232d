"""Human-readable durations ("250ms", "5s", "1h30m", "7d") and their protobuf form.

Timeouts and backoffs appear in configuration files, command lines and logs, where a bare
number of seconds is ambiguous. The accepted grammar is the Go-style subset people already
write: a non-negative decimal number followed by a unit, optionally several in a row
("1h30m"). The arithmetic is exact (integer microseconds via ``Decimal``) so that
``parse_duration(format_duration(td)) == td`` for every non-negative ``timedelta``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation

from google.protobuf import duration_pb2

__all__ = [
    "duration_from_proto",
    "duration_to_proto",
    "format_duration",
    "parse_duration",
]

# Microseconds per unit. "ms" and "us" come before "m" and "s" in the pattern so that the
# longer unit wins.
_UNITS: dict[str, int] = {
    "d": 86_400_000_000,
    "h": 3_600_000_000,
    "m": 60_000_000,
    "s": 1_000_000,
    "ms": 1_000,
    "us": 1,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|d|h|m|s)")
_WHOLE = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ms|us|d|h|m|s))+")
_ZERO = re.compile(r"0+(?:\.0*)?")


def parse_duration(text: str) -> timedelta:
    """Parse ``"250ms"``, ``"5s"``, ``"10m"``, ``"2h"``, ``"7d"``, ``"1.5s"``, ``"1h30m"`` or ``"0"``.

    Units are ``d`` (24 hours), ``h``, ``m``, ``s``, ``ms`` and ``us``. Negative durations are refused: every
    duration in lowtide is a timeout or a backoff, where a negative value is always a
    mistake. Fractions finer than a microsecond are rounded to the nearest microsecond
    (``timedelta``'s resolution).
    """
    if not isinstance(text, str):
        raise TypeError(f"duration must be a str, not {type(text).__name__}")
    stripped = text.strip()
    if _ZERO.fullmatch(stripped):
        return timedelta(0)
    if not _WHOLE.fullmatch(stripped):
        raise ValueError(_explain(text, stripped))
    micros = Decimal(0)
    for number, unit in _PART.findall(stripped):
        try:
            micros += Decimal(number) * _UNITS[unit]
        except InvalidOperation as exc:  # pragma: no cover - the pattern only lets digits through
            raise ValueError(_explain(text, stripped)) from exc
    try:
        return timedelta(microseconds=int(micros.to_integral_value()))
    except OverflowError as exc:
        raise ValueError(f"invalid duration {text!r}: too large") from exc


def _explain(text: str, stripped: str) -> str:
    hint = "expected a number followed by a unit (d, h, m, s, ms, us), e.g. '250ms', '5s', '1h30m', '7d'"
    if stripped.startswith("-"):
        return f"invalid duration {text!r}: durations cannot be negative"
    if re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", stripped):
        return f"invalid duration {text!r}: missing unit; {hint}"
    return f"invalid duration {text!r}: {hint}"


def format_duration(td: timedelta) -> str:
    """Format ``td`` in the shortest exact form that ``parse_duration`` reads back.

    Whole hours and minutes use ``h`` and ``m``; anything under a second uses ``ms`` (or
    ``us`` for sub-millisecond values); everything else is seconds with as many decimals as
    needed (``"1.5s"``, ``"90s"``). Negative values get a leading ``-`` so that they still
    read sensibly in logs, although ``parse_duration`` refuses them.
    """
    micros = _total_micros(td)
    if micros < 0:
        return "-" + format_duration(-td)
    if micros == 0:
        return "0s"
    if micros % _UNITS["h"] == 0:
        return f"{micros // _UNITS['h']}h"
    if micros % _UNITS["m"] == 0:
        return f"{micros // _UNITS['m']}m"
    if micros < _UNITS["s"]:
        if micros % _UNITS["ms"] == 0:
            return f"{micros // _UNITS['ms']}ms"
        return f"{micros}us"
    seconds, fraction = divmod(micros, _UNITS["s"])
    if fraction == 0:
        return f"{seconds}s"
    return f"{seconds}.{fraction:06d}".rstrip("0") + "s"


def _total_micros(td: timedelta) -> int:
    # td.total_seconds() is a float and loses microseconds on long durations.
    return (td.days * 86_400 + td.seconds) * 1_000_000 + td.microseconds


def duration_to_proto(td: timedelta) -> duration_pb2.Duration:
    """Convert a ``timedelta`` to a ``google.protobuf.Duration`` (exact, microsecond resolution)."""
    message = duration_pb2.Duration()
    message.FromTimedelta(td)
    return message


def duration_from_proto(message: duration_pb2.Duration) -> timedelta:
    """Convert a ``google.protobuf.Duration`` to a ``timedelta`` (nanoseconds are truncated)."""
    return message.ToTimedelta()
