"""Configuration: a TOML file (`--config` or LOWTIDE_CONFIG), every key overridable from the
environment as LOWTIDE_<SECTION>_<KEY> (e.g. `[scheduler] listen` <- LOWTIDE_SCHEDULER_LISTEN,
`[database] url` <- LOWTIDE_DATABASE_URL). Durations are written `250ms`, `5s`, `10m`, `2h`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from lowtide.errors import ConfigError
from lowtide_client._durations import parse_duration


@dataclass(frozen=True)
class DatabaseConfig:
    # No URL: `lowtide up` starts an embedded PostgreSQL whose data lives in data_dir.
    url: str = ""
    data_dir: str = "~/.local/share/lowtide"
    pool_min: int = 2
    pool_max: int = 16


@dataclass(frozen=True)
class SchedulerConfig:
    listen: str = "127.0.0.1:50051"
    # The fallback when no wake-up arrives; submits and freed slots wake dispatch at once.
    poll_interval: timedelta = timedelta(milliseconds=500)
    # Workers send a heartbeat this often; silence for lease_timeout loses them their tasks.
    heartbeat_interval: timedelta = timedelta(seconds=2)
    lease_timeout: timedelta = timedelta(seconds=10)
    # Time-driven work (timeouts, lost leases) runs this often, on the leader only.
    maintenance_interval: timedelta = timedelta(milliseconds=500)
    leader_lease: timedelta = timedelta(seconds=5)
    max_payload_bytes: int = 1024 * 1024
    max_batch_tasks: int = 10_000
    max_message_bytes: int = 64 * 1024 * 1024
    # Concurrent streams (calls) one client connection may have open: beyond it a client's
    # further calls wait for its own to finish instead of crowding out the others. Note that
    # grpc shares one connection between the channels a process opens to the same target.
    max_concurrent_streams: int = 10_000
    # The signal service the scheduler subscribes to for cost holds.
    signal_target: str = "127.0.0.1:50052"
    # Prometheus /metrics (empty: not served).
    metrics_listen: str = "127.0.0.1:9464"
    # How often queue figures (depth, held depth, ages) are read from the database.
    metrics_interval: timedelta = timedelta(seconds=5)


@dataclass(frozen=True)
class RetryConfig:
    """Defaults for a task whose retry policy leaves a field unset."""

    max_attempts: int = 3
    initial_backoff: timedelta = timedelta(seconds=1)
    backoff_coefficient: float = 2.0
    max_backoff: timedelta = timedelta(minutes=1)


@dataclass(frozen=True)
class TypeConfig:
    """Per activity type settings, from `[types.NAME]`."""

    max_concurrency: int | None = None
    # A local activity runs inline in a workflow task and is never queued: no hold may name it.
    local: bool = False
    # A cost hold defers tasks of this type at most this long (unless the task sets its own).
    max_defer: timedelta | None = None
    # A default the submitter's own schedule_to_start overrides; on a held type it warns.
    schedule_to_start: timedelta | None = None
    # For fixed starts that do not give their own estimated_duration.
    estimated_duration: timedelta | None = None


@dataclass(frozen=True)
class PoolConfig:
    """Per pool settings, from `[pools.NAME]`; a pool not configured gets these defaults."""

    max_workers: int = 1
    # At most max(1, floor(max_workers x reservable_fraction)) reservations may overlap.
    reservable_fraction: float = 0.5
    # The longest a slot is held idle before a fixed start (and when holding is first checked).
    max_hold: timedelta = timedelta(minutes=5)
    # Reservations starting within this horizon count in the pool's desired workers.
    autoscale_horizon: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class QueueConfig:
    """Per queue settings, from `[queues.NAME]`."""

    # Held while the cost signal is high, on this queue only (beside [cost] deferrable_activities).
    deferrable_activities: tuple[str, ...] = ()
    # Overload: at most this many claimable pending tasks (held work and fixed starts not
    # counted); beyond it `overflow` applies: reject, shed_lowest or shed_oldest.
    max_depth: int | None = None
    overflow: str = "reject"


@dataclass(frozen=True)
class SignalConfig:
    """The signal service, and the feed that drives the default signal (`[cost] signal`)."""

    listen: str = "127.0.0.1:50052"
    # Prometheus /metrics (empty: not served).
    metrics_listen: str = "127.0.0.1:9465"
    # static (SetSignal only), replay, uk-carbon-intensity, electricitymaps or watttime.
    feed: str = "static"
    # The default signal's unit; empty means the feed's own (gCO2/kWh, or percentile for watttime).
    unit: str = ""
    # With no update for this long the signal is marked stale and subscribers are told.
    stale_after: timedelta = timedelta(hours=1)
    # How often a feed is polled; the grid APIs publish every 5 to 30 minutes.
    refresh: timedelta = timedelta(minutes=5)
    # Replay: trace seconds played per wall-clock second (1440 = one day per minute), from
    # replay_start (ISO 8601; empty = the trace's first row), of replay_file (empty = bundled GB 2020).
    replay_speed: float = 1440.0
    replay_start: str = ""
    replay_file: str = ""
    # At the trace's end: start again (true), or hold its last value (false).
    replay_loop: bool = True
    # The replay's forecast is the trace ahead times (1 + this x N(0, 1)): 0.05 is about a real
    # grid forecast's error, and 0 hands planners the future itself.
    replay_forecast_error: float = 0.05
    # Empty base_url means the feed's public API.
    base_url: str = ""
    token: str = ""
    username: str = ""
    password: str = ""
    # UK Carbon Intensity region id, Electricity Maps zone or WattTime region.
    region: str = ""
    timeout: timedelta = timedelta(seconds=10)


@dataclass(frozen=True)
class CostConfig:
    # The default signal: the one the feed drives and the scheduler's cost holds read.
    signal: str = "grid"
    defer_threshold: float = 400.0
    # Activity types held on every queue while the signal is high.
    deferrable_activities: tuple[str, ...] = ()
    # A parked dispatch reference of a held type is looked at again after this long.
    hold_recheck: timedelta = timedelta(seconds=5)
    # Hysteresis (optional): once on, the hold ends only below release_below ...
    release_below: float | None = None
    # ... and not before it has lasted min_hold.
    min_hold: timedelta = timedelta(0)
    # What a stale signal means to the scheduler: "hold" (the default) or "release".
    on_stale: str = "hold"


@dataclass(frozen=True)
class SignalDefinition:
    """A further named signal, from `[signals.NAME]`; set through SetSignal only."""

    unit: str = "gCO2/kWh"
    threshold: float = 400.0


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


def _auth(values: Mapping[str, Any], env: Mapping[str, str]) -> AuthConfig:
    """`[auth]`: tokens are a list of tables, so they are read here rather than by _section;
    LOWTIDE_AUTH=off|on is the short form of LOWTIDE_AUTH_ENABLED."""
    values = dict(values)
    entries = values.pop("tokens", [])
    env = dict(env)
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


def _coerce(section: str, key: str, kind: Any, raw: Any) -> Any:
    where = f"[{section}] {key}"
    try:
        if kind == "timedelta" or kind is timedelta:
            return raw if isinstance(raw, timedelta) else parse_duration(str(raw))
        if kind in ("int", int):
            if isinstance(raw, bool):
                raise ValueError("not an integer")
            return int(raw)
        if kind in ("float", float):
            return float(raw)
        if kind in ("str", str):
            return str(raw)
        if kind in ("int | None",):
            return None if raw in (None, "") else int(raw)
        if kind in ("float | None",):
            return None if raw in (None, "") else float(raw)
        if kind in ("timedelta | None",):
            return None if raw in (None, "") else parse_duration(str(raw))
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


def _section(name: str, cls: type[Any], values: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    known = {f.name: f.type for f in fields(cls)}
    unknown = set(values) - set(known)
    if unknown:
        raise ConfigError(f"[{name}]: unknown key(s) {', '.join(sorted(unknown))}")
    merged: dict[str, Any] = dict(values)
    for key in known:
        env_key = f"LOWTIDE_{name}_{key}".upper()
        if env_key in env:
            merged[key] = env[env_key]
    return replace(cls(), **{k: _coerce(name, k, known[k], v) for k, v in merged.items()})


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Reads the TOML file (when given, or named by LOWTIDE_CONFIG) and applies the environment."""
    env = os.environ if env is None else env
    path = path or env.get("LOWTIDE_CONFIG") or None
    data: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config file {path}: {error}") from None
    unknown = set(data) - {*_SECTIONS, "auth", "types", "signals", "queues", "pools", "resources"}
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(sorted(unknown))}")
    sections = {name: _section(name, cls, data.get(name, {}), env) for name, cls in _SECTIONS.items()}
    types: dict[str, TypeConfig] = {}
    for type_name, values in data.get("types", {}).items():
        types[type_name] = _section(f"types.{type_name}", TypeConfig, values, {})
        limit = types[type_name].max_concurrency
        if limit is not None and limit < 1:
            raise ConfigError(f"[types.{type_name}] max_concurrency: must be at least 1")
    signals = {
        name: _section(f"signals.{name}", SignalDefinition, values, {})
        for name, values in data.get("signals", {}).items()
    }
    queues = {
        name: _section(f"queues.{name}", QueueConfig, values, {}) for name, values in data.get("queues", {}).items()
    }
    pools = {name: _section(f"pools.{name}", PoolConfig, values, {}) for name, values in data.get("pools", {}).items()}
    for name, pool in pools.items():
        if pool.max_workers < 1:
            raise ConfigError(f"[pools.{name}] max_workers: must be at least 1")
        if not 0.0 < pool.reservable_fraction <= 1.0:
            raise ConfigError(f"[pools.{name}] reservable_fraction: must be in (0, 1]")
    for name, queue in queues.items():
        if queue.overflow not in ("reject", "shed_lowest", "shed_oldest"):
            raise ConfigError(f'[queues.{name}] overflow: must be "reject", "shed_lowest" or "shed_oldest"')
        if queue.max_depth is not None and queue.max_depth < 1:
            raise ConfigError(f"[queues.{name}] max_depth: must be at least 1")
    if sections["cost"].on_stale not in ("hold", "release"):
        raise ConfigError('[cost] on_stale: must be "hold" or "release"')
    resources: dict[str, int] = {}
    for name, capacity in data.get("resources", {}).items():
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ConfigError(f"[resources] {name}: must be a whole number at least 0")
        resources[name] = capacity
    auth = _auth(data.get("auth", {}), env)
    if sections["scheduler"].max_concurrent_streams < 1:
        raise ConfigError("[scheduler] max_concurrent_streams: must be at least 1")
    return Config(types=types, signals=signals, queues=queues, pools=pools, resources=resources, auth=auth, **sections)
