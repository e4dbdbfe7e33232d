"""What configuration keys accept: `key(default, rule)` declares a key with its rule, the rules
themselves (`within`, `one_of`, addresses ...), and `MARGINS`, the few rules that relate two keys
of a section. A rule says what is wrong with a value, or None."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import Field, field
from datetime import timedelta
from typing import Any, TypeVar

from lowtide.errors import ConfigError
from lowtide_proto.durations import format_duration

T = TypeVar("T")

# A rule says what is wrong with a value (None: nothing). Values left unset (None) are not checked.
Rule = Callable[[Any], "str | None"]

MS = timedelta(milliseconds=1)
S = timedelta(seconds=1)
MIN = timedelta(minutes=1)
H = timedelta(hours=1)
DAY = timedelta(days=1)
# The longest duration a task may ask for (scheduler_service.wire.inbound.MAX_DURATION).
LONGEST = 366 * DAY
INT32 = 2**31 - 1
_RULE = "lowtide.rule"
_SECRET = "lowtide.secret"


def show(value: Any) -> str:
    """A value as an error message shows it: durations as they are written in the file."""
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def within(low: Any, high: Any, *, above: bool = False) -> Rule:
    """From low (excluded when `above`) to high, inclusive."""

    def rule(value: Any) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number {'above' if above else 'from'} {show(low)} to {show(high)}"
        if (value <= low if above else value < low) or value > high:
            if above:
                return f"must be above {show(low)} and at most {show(high)}"
            return f"must be between {show(low)} and {show(high)}"
        return None

    return rule


def finite(value: Any) -> str | None:
    return None if math.isfinite(value) else "must be a finite number"


def one_of(*choices: str) -> Rule:
    def rule(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(repr(c) for c in choices)}"

    return rule


def not_empty(value: Any) -> str | None:
    return None if value else "must not be empty"


def _port_problem(port: str, low: int) -> str | None:
    if not port.isdigit() or not low <= int(port) <= 65535:
        return f"must be host:port with a port from {low} to 65535"
    return None


def _address_problem(address: str, low_port: int) -> str | None:
    host, colon, port = address.rpartition(":")
    if not colon or not host:
        return "must be host:port"
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return "must be host:port, an IPv6 host in brackets ([::1]:50051)"
    return _port_problem(port, low_port)


def listen_address(value: Any) -> str | None:
    """host:port to listen on; port 0 takes any free port."""
    problem = _address_problem(value, 0)
    return f"{problem} (e.g. 127.0.0.1:50051)" if problem else None


def listen_address_or_off(value: Any) -> str | None:
    """host:port, or empty for not served."""
    return listen_address(value) if value else None


def grpc_target(value: Any) -> str | None:
    """A gRPC target: host:port, or a URI such as dns:///host:port or unix:/path."""
    if not value:
        return "must not be empty"
    if "://" in value or value.startswith(("unix:", "unix-abstract:", "ipv4:", "ipv6:")):
        return None
    problem = _address_problem(value, 1)
    return f"{problem} (e.g. 127.0.0.1:50052)" if problem else None


def database_url(value: Any) -> str | None:
    if not value:
        return None  # no database: `lowtide up` starts an embedded one
    from lowtide.db.connector import conninfo_problem

    return conninfo_problem(value)


def key(default: T, rule: Rule | None = None, *, secret: bool = False) -> T:
    """A configuration key: its default and what it accepts. A secret's value (a URL with a
    password) is never repeated in an error."""
    return field(default=default, metadata={_RULE: rule, _SECRET: secret})


def check(where: str, spec: Field[Any], value: Any) -> None:
    """Raises ConfigError, naming the key as `where`, when a set value breaks its key's rule."""
    rule = spec.metadata.get(_RULE)
    problem = rule(value) if rule is not None and value is not None else None
    if problem:
        raise ConfigError(f"{where}: {problem}" + ("" if spec.metadata.get(_SECRET) else f", not {show(value)}"))


# Keys that must keep a margin over another key of their section: (section, key, other, factor,
# why). Checked after every key has passed its own rule.
MARGINS: tuple[tuple[str, str, str, int, str], ...] = (
    ("database", "pool_max", "pool_min", 1, "the pool cannot keep more connections than it may open"),
    ("scheduler", "lease_timeout", "heartbeat_interval", 2, "a worker must not lose its tasks for one late heartbeat"),
    ("scheduler", "idle_heartbeat_interval", "heartbeat_interval", 1, "idle workers beat no more often than busy ones"),
    ("scheduler", "lease_timeout", "reconnect_grace", 1, "a lease that runs out gives up its attempts, grace or not"),
    ("scheduler", "leader_lease", "maintenance_interval", 2, "the leader renews its lease once per maintenance round"),
    ("scheduler", "max_message_bytes", "max_payload_bytes", 1, "a payload travels inside one gRPC message"),
    ("retry", "max_backoff", "initial_backoff", 1, "the first backoff is initial_backoff"),
    ("signal", "forecast_error_prior_24h", "forecast_error_prior_1h", 1, "the prior's error grows with the lead"),
)


def check_margins(sections: Mapping[str, Any], where: Callable[[str, str], str]) -> None:
    """Raises ConfigError for the first of `MARGINS` the sections break; `where(section, key)`
    names the key as the error shows it."""
    for section, name, other, factor, why in MARGINS:
        value, bound = getattr(sections[section], name), getattr(sections[section], other) * factor
        if value < bound:
            times = f"{factor} x " if factor != 1 else ""
            raise ConfigError(
                f"{where(section, name)}: must be at least {times}[{section}] {other} ({show(bound)}), "
                f"not {show(value)}: {why}"
            )
