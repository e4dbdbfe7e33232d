"""Configuration: a TOML file (`--config` or LOWTIDE_CONFIG), every key overridable from the
environment as LOWTIDE_<SECTION>_<KEY> (e.g. `[scheduler] listen` <- LOWTIDE_SCHEDULER_LISTEN,
`[database] url` <- LOWTIDE_DATABASE_URL). Durations are written `250ms`, `5s`, `10m`, `2h`.

Every key declares what it accepts next to its default (`key(default, rule)`), and
`load_config` checks each value against it at start-up: a value that would break a service
(a lease of 0s, a port of 99999, a NaN threshold) is refused with one line naming the key and
what it accepts. `_MARGINS` holds the few rules that relate two keys.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from lowtide.errors import ConfigError
from lowtide_proto.durations import format_duration, parse_duration

log = logging.getLogger("lowtide.config")

T = TypeVar("T")

# A rule says what is wrong with a value (None: nothing). Values left unset (None) are not checked.
Rule = Callable[[Any], "str | None"]

_MS = timedelta(milliseconds=1)
_S = timedelta(seconds=1)
_MIN = timedelta(minutes=1)
_H = timedelta(hours=1)
_DAY = timedelta(days=1)
# The longest duration a task may ask for (scheduler_service.convert.MAX_DURATION).
_LONGEST = 366 * _DAY
_INT32 = 2**31 - 1
_RULE = "lowtide.rule"
_SECRET = "lowtide.secret"


def _show(value: Any) -> str:
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
            return f"must be a finite number {'above' if above else 'from'} {_show(low)} to {_show(high)}"
        if (value <= low if above else value < low) or value > high:
            if above:
                return f"must be above {_show(low)} and at most {_show(high)}"
            return f"must be between {_show(low)} and {_show(high)}"
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


@dataclass(frozen=True)
class DatabaseConfig:
    # No URL: `lowtide up` starts an embedded PostgreSQL whose data lives in data_dir.
    url: str = key("", database_url, secret=True)
    data_dir: str = "~/.local/share/lowtide"
    pool_min: int = key(2, within(0, 1000))
    pool_max: int = key(16, within(1, 1000))


@dataclass(frozen=True)
class SchedulerConfig:
    listen: str = key("127.0.0.1:50051", listen_address)
    # The fallback when no wake-up arrives; submits and freed slots wake dispatch at once.
    poll_interval: timedelta = key(500 * _MS, within(50 * _MS, 10 * _MIN))
    # Workers send a heartbeat this often; silence for lease_timeout loses them their tasks.
    heartbeat_interval: timedelta = key(2 * _S, within(100 * _MS, 5 * _MIN))
    lease_timeout: timedelta = key(10 * _S, within(1 * _S, 1 * _H))
    # Time-driven work (timeouts, lost leases) runs this often, on the leader only.
    maintenance_interval: timedelta = key(500 * _MS, within(10 * _MS, 1 * _MIN))
    leader_lease: timedelta = key(5 * _S, within(1 * _S, 10 * _MIN))
    max_payload_bytes: int = key(1024 * 1024, within(0, _INT32))
    max_batch_tasks: int = key(10_000, within(1, 1_000_000))
    max_message_bytes: int = key(16 * 1024 * 1024, within(64 * 1024, _INT32))
    # Concurrent streams (calls) one client connection may have open: beyond it a client's
    # further calls wait for its own to finish instead of crowding out the others. Note that
    # grpc shares one connection between the channels a process opens to the same target.
    max_concurrent_streams: int = key(10_000, within(1, _INT32))
    # The signal service the scheduler subscribes to for cost holds.
    signal_target: str = key("127.0.0.1:50052", grpc_target)
    # Prometheus /metrics (empty: not served).
    metrics_listen: str = key("127.0.0.1:9464", listen_address_or_off)
    # How often queue figures (depth, held depth, ages) are read from the database.
    metrics_interval: timedelta = key(5 * _S, within(100 * _MS, 1 * _H))


@dataclass(frozen=True)
class RetryConfig:
    """Defaults for a task whose retry policy leaves a field unset."""

    # The bounds a task's own retry policy has too (scheduler_service.convert).
    max_attempts: int = key(3, within(1, 10_000))
    initial_backoff: timedelta = key(1 * _S, within(timedelta(0), _LONGEST))
    backoff_coefficient: float = key(2.0, within(1.0, 100.0))
    max_backoff: timedelta = key(1 * _MIN, within(timedelta(0), _LONGEST))


@dataclass(frozen=True)
class TypeConfig:
    """Per activity type settings, from `[types.NAME]`."""

    max_concurrency: int | None = key(None, within(1, 1_000_000))
    # A local activity runs inline in a workflow task and is never queued: no hold may name it.
    local: bool = False
    # A cost hold defers tasks of this type at most this long (unless the task sets its own).
    max_defer: timedelta | None = key(None, within(timedelta(0), _LONGEST, above=True))
    # A default the submitter's own schedule_to_start overrides; on a held type it warns.
    schedule_to_start: timedelta | None = key(None, within(timedelta(0), _LONGEST, above=True))
    # For fixed starts that do not give their own estimated_duration.
    estimated_duration: timedelta | None = key(None, within(timedelta(0), _LONGEST, above=True))


@dataclass(frozen=True)
class PoolConfig:
    """Per pool settings, from `[pools.NAME]`; a pool not configured gets these defaults."""

    max_workers: int = key(1, within(1, 1_000_000))
    # At most max(1, floor(max_workers x reservable_fraction)) reservations may overlap.
    reservable_fraction: float = key(0.5, within(0.0, 1.0, above=True))
    # The longest a slot is held idle before a fixed start (and when holding is first checked).
    max_hold: timedelta = key(5 * _MIN, within(timedelta(0), 1 * _DAY))
    # Reservations starting within this horizon count in the pool's desired workers.
    autoscale_horizon: timedelta = key(10 * _MIN, within(timedelta(0), _LONGEST))


@dataclass(frozen=True)
class QueueConfig:
    """Per queue settings, from `[queues.NAME]`."""

    # Held while the cost signal is high, on this queue only (beside [cost] deferrable_activities).
    deferrable_activities: tuple[str, ...] = ()
    # Overload: at most this many claimable pending tasks (held work and fixed starts not
    # counted); beyond it `overflow` applies: reject, shed_lowest or shed_oldest.
    max_depth: int | None = key(None, within(1, 2**62))
    overflow: str = key("reject", one_of("reject", "shed_lowest", "shed_oldest"))


# The feeds signal_service.feeds.make_feed knows.
FEEDS = ("static", "replay", "uk-carbon-intensity", "electricitymaps", "watttime")


@dataclass(frozen=True)
class SignalConfig:
    """The signal service, and the feed that drives the default signal (`[cost] signal`)."""

    listen: str = key("127.0.0.1:50052", listen_address)
    # Prometheus /metrics (empty: not served).
    metrics_listen: str = key("127.0.0.1:9465", listen_address_or_off)
    # static (SetSignal only), replay, uk-carbon-intensity, electricitymaps or watttime.
    feed: str = key("static", one_of(*FEEDS))
    # The default signal's unit; empty means the feed's own (gCO2/kWh, or percentile for watttime).
    unit: str = ""
    # With no update for this long the signal is marked stale and subscribers are told.
    stale_after: timedelta = key(1 * _H, within(1 * _S, _LONGEST))
    # How often a feed is polled; the grid APIs publish every 5 to 30 minutes.
    refresh: timedelta = key(5 * _MIN, within(100 * _MS, 1 * _DAY))
    # Replay: trace seconds played per wall-clock second (1440 = one day per minute), from
    # replay_start (ISO 8601; empty = the trace's first row), of replay_file (empty = bundled GB 2020).
    replay_speed: float = key(1440.0, within(0.0, 1e9, above=True))
    replay_start: str = ""
    replay_file: str = ""
    # At the trace's end: start again (true), or hold its last value (false).
    replay_loop: bool = True
    # The replay's forecast is the trace ahead times (1 + this x N(0, 1)): 0.05 is about a real
    # grid forecast's error, and 0 hands planners the future itself.
    replay_forecast_error: float = key(0.05, within(0.0, 1.0))
    # Empty base_url means the feed's public API.
    base_url: str = ""
    token: str = ""
    username: str = ""
    password: str = ""
    # UK Carbon Intensity region id, Electricity Maps zone or WattTime region.
    region: str = ""
    timeout: timedelta = key(10 * _S, within(100 * _MS, 10 * _MIN))


@dataclass(frozen=True)
class CostConfig:
    # The default signal: the one the feed drives and the scheduler's cost holds read.
    signal: str = key("grid", not_empty)
    # Any finite value: a price signal may well be negative.
    defer_threshold: float = key(400.0, finite)
    # Activity types held on every queue while the signal is high.
    deferrable_activities: tuple[str, ...] = ()
    # A parked dispatch reference of a held type is looked at again after this long.
    hold_recheck: timedelta = key(5 * _S, within(10 * _MS, 1 * _H))
    # Hysteresis (optional): once on, the hold ends only below release_below ...
    release_below: float | None = key(None, finite)
    # ... and not before it has lasted min_hold.
    min_hold: timedelta = key(timedelta(0), within(timedelta(0), 1 * _DAY))
    # What a stale signal means to the scheduler: "hold" (the default) or "release".
    on_stale: str = key("hold", one_of("hold", "release"))


@dataclass(frozen=True)
class SignalDefinition:
    """A further named signal, from `[signals.NAME]`; set through SetSignal only."""

    unit: str = "gCO2/kWh"
    threshold: float = key(400.0, finite)


@dataclass(frozen=True)
class TokenEntry:
    """One accepted token, from `[[auth.tokens]]`: only its SHA-256 is kept (`lowtide token hash`)."""

    name: str
    role: str
    sha256: str


@dataclass(frozen=True)
class AuthConfig:
    """Bearer tokens in gRPC metadata (`authorization: Bearer <token>`), each with a role."""

    # On unless switched off explicitly: LOWTIDE_AUTH=off (or [auth] enabled = false).
    enabled: bool = True
    # With auth off a service listens on loopback only, unless this says otherwise.
    allow_insecure_remote: bool = False
    tokens: tuple[TokenEntry, ...] = ()
    # The token the scheduler presents to the signal service (empty: none); the CLI and the
    # clients read theirs from LOWTIDE_TOKEN instead.
    signal_token: str = ""


@dataclass(frozen=True)
class TlsConfig:
    """TLS for both services; empty cert and key mean plaintext."""

    cert: str = ""
    key: str = ""
    # When set, clients must present a certificate signed by this CA (mutual TLS).
    client_ca: str = ""
    # The CA the scheduler trusts for the signal service (empty: plaintext to it).
    signal_ca: str = ""


@dataclass(frozen=True)
class Config:
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    signal: SignalConfig = field(default_factory=SignalConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    types: Mapping[str, TypeConfig] = field(default_factory=dict)
    signals: Mapping[str, SignalDefinition] = field(default_factory=dict)
    queues: Mapping[str, QueueConfig] = field(default_factory=dict)
    pools: Mapping[str, PoolConfig] = field(default_factory=dict)
    # Named capacities from `[resources]` (gpu = 2): tasks ask for amounts of them.
    resources: Mapping[str, int] = field(default_factory=dict)

    def pool(self, name: str) -> PoolConfig:
        return self.pools.get(name) or PoolConfig()


_SECTIONS = {
    "database": DatabaseConfig,
    "scheduler": SchedulerConfig,
    "retry": RetryConfig,
    "signal": SignalConfig,
    "cost": CostConfig,
    "tls": TlsConfig,
}

ROLES = ("worker", "submitter", "admin")


# Keys that must keep a margin over another key of their section: (section, key, other, factor,
# why). Checked after every key has passed its own rule.
_MARGINS: tuple[tuple[str, str, str, int, str], ...] = (
    ("database", "pool_max", "pool_min", 1, "the pool cannot keep more connections than it may open"),
    ("scheduler", "lease_timeout", "heartbeat_interval", 2, "a worker must not lose its tasks for one late heartbeat"),
    ("scheduler", "leader_lease", "maintenance_interval", 2, "the leader renews its lease once per maintenance round"),
    ("scheduler", "max_message_bytes", "max_payload_bytes", 1, "a payload travels inside one gRPC message"),
    ("retry", "max_backoff", "initial_backoff", 1, "the first backoff is initial_backoff"),
)

# LOWTIDE_ variables that are not configuration keys, with who reads them; any other LOWTIDE_
# variable that is not a key is warned about at start-up.
OTHER_VARIABLES = frozenset(
    {
        "LOWTIDE_CONFIG",  # the configuration file (here)
        "LOWTIDE_AUTH",  # off|on, the short form of LOWTIDE_AUTH_ENABLED (here)
        # The credentials of the CLI, lowtide_client users and the Node worker library.
        "LOWTIDE_TOKEN",
        "LOWTIDE_CA",
        "LOWTIDE_CERT",
        "LOWTIDE_KEY",
        "LOWTIDE_LOG_LEVEL",  # lowtide.logs
        "LOWTIDE_LOG_FORMAT",
        "LOWTIDE_TEST_DATABASE_URL",  # the test suite
        "LOWTIDE_BENCH_DATABASE_URL",  # the benchmarks
        "LOWTIDE_PUBLISH_ADDR",  # docker-compose.yml: the address its ports are published on
        # The Node worker library and its example worker (clients/node).
        "LOWTIDE_PROTO_DIR",
        "LOWTIDE_TARGET",
        "LOWTIDE_POOL",
        "LOWTIDE_QUEUES",
        "LOWTIDE_ACTIVITY_TYPES",
        "LOWTIDE_SLOTS",
        "LOWTIDE_SUBMIT_TOKEN",
    }
)


def config_variables() -> frozenset[str]:
    """The environment variables that override configuration keys."""
    names = {_variable(section, f.name) for section, cls in _SECTIONS.items() for f in fields(cls)}
    # [auth] tokens are a list of tables: the file only.
    names |= {_variable("auth", f.name) for f in fields(AuthConfig) if f.name != "tokens"}
    return frozenset(names)


def _variable(section: str, name: str) -> str:
    return f"LOWTIDE_{section}_{name}".upper()


def _where(section: str, name: str, env: Mapping[str, str]) -> str:
    """How an error names a key: with its variable when the value came from the environment."""
    variable = _variable(section, name)
    return f"{variable} ([{section}] {name})" if variable in env else f"[{section}] {name}"


def _warn_unknown_variables(env: Mapping[str, str]) -> None:
    known = config_variables() | OTHER_VARIABLES
    for name in sorted(env):
        if name.startswith("LOWTIDE_") and name not in known:
            closest = difflib.get_close_matches(name, sorted(known), n=1)
            log.warning(
                "config.unknown_variable",
                extra={"variable": name, "did_you_mean": closest[0] if closest else "-"},
            )


def _auth(values: Mapping[str, Any], env: Mapping[str, str]) -> AuthConfig:
    """`[auth]`: tokens are a list of tables, so they are read here rather than by _section;
    LOWTIDE_AUTH=off|on is the short form of LOWTIDE_AUTH_ENABLED."""
    values = dict(values)
    entries = values.pop("tokens", [])
    env = {name: value for name, value in env.items() if name != _variable("auth", "tokens")}
    if "LOWTIDE_AUTH" in env:
        switch = env["LOWTIDE_AUTH"].lower()
        if switch not in ("off", "on"):
            raise ConfigError(f'LOWTIDE_AUTH: must be "off" or "on", not {env["LOWTIDE_AUTH"]!r}')
        env.setdefault("LOWTIDE_AUTH_ENABLED", "true" if switch == "on" else "false")
    base: AuthConfig = _section("auth", AuthConfig, values, env)
    if not isinstance(entries, list):
        raise ConfigError("[auth] tokens: must be a list of {name, role, sha256} tables")
    tokens = []
    for i, entry in enumerate(entries):
        where = f"[auth] tokens[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "role", "sha256"}:
            raise ConfigError(f"{where}: must have exactly name, role and sha256")
        if entry["role"] not in ROLES:
            raise ConfigError(f"{where}: role must be one of {', '.join(ROLES)}, not {entry['role']!r}")
        digest = str(entry["sha256"]).lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(f"{where}: sha256 must be 64 hex digits (see `lowtide token hash`)")
        tokens.append(TokenEntry(str(entry["name"]), str(entry["role"]), digest))
    return replace(base, tokens=tuple(tokens))


def _coerce(where: str, kind: Any, raw: Any) -> Any:
    """The value of a key from TOML or from the environment (a string), as its field's type."""
    if isinstance(kind, str) and kind.endswith(" | None"):
        return None if raw in (None, "") else _coerce(where, kind.removesuffix(" | None"), raw)
    try:
        if kind in ("timedelta", timedelta):
            if isinstance(raw, timedelta):
                return raw
            return parse_duration(str(raw))
        if kind in ("int", int):
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(f"must be a whole number, not {raw!r}")
            try:
                return int(raw.strip() if isinstance(raw, str) else raw)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"must be a whole number, not {raw!r}") from None
        if kind in ("float", float):
            if isinstance(raw, bool):
                raise ValueError(f"must be a number, not {raw!r}")
            try:
                return float(raw)
            except (TypeError, ValueError):
                raise ValueError(f"must be a number, not {raw!r}") from None
        if kind in ("str", str):
            if isinstance(raw, dict | list):
                raise ValueError("must be a string")
            return str(raw)
        if kind in ("bool", bool):
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "1", "yes"):
                return True
            if str(raw).lower() in ("false", "0", "no"):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        if kind in ("tuple[str, ...]",):
            if isinstance(raw, str):
                raw = [part.strip() for part in raw.split(",") if part.strip()]
            if not isinstance(raw, list | tuple) or not all(isinstance(x, str) for x in raw):
                raise ValueError("must be a list of names")
            return tuple(raw)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None
    raise ConfigError(f"{where}: unsupported type {kind}")  # pragma: no cover


def _section(name: str, cls: type[Any], values: Any, env: Mapping[str, str]) -> Any:
    """One section's keys from the file, overridden from the environment, each checked against
    its rule."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"[{name}]: must be a table of keys, not {values!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = set(values) - set(known)
    if unknown:
        raise ConfigError(f"[{name}]: unknown key(s) {', '.join(sorted(unknown))}")
    merged: dict[str, Any] = dict(values)
    for key_name in known:
        variable = _variable(name, key_name)
        if variable in env:
            merged[key_name] = env[variable]
    settings: dict[str, Any] = {}
    for key_name, raw in merged.items():
        where = _where(name, key_name, env)
        spec = known[key_name]
        value = _coerce(where, spec.type, raw)
        rule = spec.metadata.get(_RULE)
        problem = rule(value) if rule is not None and value is not None else None
        if problem:
            raise ConfigError(f"{where}: {problem}" + ("" if spec.metadata.get(_SECRET) else f", not {_show(value)}"))
        settings[key_name] = value
    return replace(cls(), **settings)


def _check_margins(sections: Mapping[str, Any], env: Mapping[str, str]) -> None:
    for section, name, other, factor, why in _MARGINS:
        value, bound = getattr(sections[section], name), getattr(sections[section], other) * factor
        if value < bound:
            times = f"{factor} x " if factor != 1 else ""
            raise ConfigError(
                f"{_where(section, name, env)}: must be at least {times}[{section}] {other} ({_show(bound)}), "
                f"not {_show(value)}: {why}"
            )


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"config file {path}: not UTF-8 text (byte {raw[error.start]:#04x} at offset {error.start})"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path}: not valid TOML: {error}") from None


def _tables(data: Mapping[str, Any], name: str, cls: type[T]) -> dict[str, T]:
    """`[types.NAME]`, `[pools.NAME]` ...: one table per name, read from the file only."""
    tables = data.get(name, {})
    if not isinstance(tables, Mapping):
        raise ConfigError(f"[{name}]: must be tables such as [{name}.NAME], not {tables!r}")
    return {entry: _section(f"{name}.{entry}", cls, values, {}) for entry, values in tables.items()}


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Reads the TOML file (when given, or named by LOWTIDE_CONFIG) and applies the environment;
    a value a key does not accept raises ConfigError, one line naming the key. An unknown
    LOWTIDE_ variable is logged as a warning naming the closest known one."""
    env = os.environ if env is None else env
    _warn_unknown_variables(env)
    path = path or env.get("LOWTIDE_CONFIG") or None
    data = _read_toml(path) if path else {}
    unknown = set(data) - {*_SECTIONS, "auth", "types", "signals", "queues", "pools", "resources"}
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(sorted(unknown))}")
    sections = {name: _section(name, cls, data.get(name, {}), env) for name, cls in _SECTIONS.items()}
    _check_margins(sections, env)
    resources: dict[str, int] = {}
    raw_resources = data.get("resources", {})
    if not isinstance(raw_resources, Mapping):
        raise ConfigError(f"[resources]: must be a table of name = capacity, not {raw_resources!r}")
    for name, capacity in raw_resources.items():
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 <= capacity <= _INT32:
            raise ConfigError(f"[resources] {name}: must be a whole number from 0 to {_INT32}, not {capacity!r}")
        resources[name] = capacity
    auth = _auth(_table_or_fail(data, "auth"), env)
    return Config(
        types=_tables(data, "types", TypeConfig),
        signals=_tables(data, "signals", SignalDefinition),
        queues=_tables(data, "queues", QueueConfig),
        pools=_tables(data, "pools", PoolConfig),
        resources=resources,
        auth=auth,
        **sections,
    )


def _table_or_fail(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{name}]: must be a table of keys, not {table!r}")
    return table
