"""Loading the configuration: the TOML file (`--config` or LOWTIDE_CONFIG), every key overridden
from the environment as LOWTIDE_<SECTION>_<KEY> (e.g. `[scheduler] listen` <-
LOWTIDE_SCHEDULER_LISTEN), each value checked against its key's rule and the margins between
keys; an unknown LOWTIDE_ variable is warned about."""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from lowtide.config.rules import INT32, check, check_margins
from lowtide.config.schema import (
    ROLES,
    SECTIONS,
    AdaptiveConcurrencyConfig,
    AuthConfig,
    Config,
    PoolConfig,
    QueueConfig,
    TokenEntry,
    TypeConfig,
)
from lowtide.config.signals import (
    SignalConfig,
    SignalDefinition,
)
from lowtide.errors import ConfigError
from lowtide_proto.durations import parse_duration

# The logger is "lowtide.config", the name its warnings have always carried (the README shows one).
log = logging.getLogger("lowtide.config")

T = TypeVar("T")

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
        "LOWTIDE_EVENT_LOOP",  # lowtide.event_loop
        "LOWTIDE_TEST_DATABASE_URL",  # the test suite
        "LOWTIDE_BENCH_DATABASE_URL",  # the benchmarks
        "LOWTIDE_CONSOLE_SCREENSHOTS",  # tests/console: the folder its screenshots go to
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
    names = {_variable(section, f.name) for section, cls in SECTIONS.items() for f in fields(cls)}
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
    if kind == "AdaptiveConcurrencyConfig":
        return _adaptive(where, raw)
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
        check(where, spec, value)
        settings[key_name] = value
    return replace(cls(), **settings)


def _adaptive(where: str, raw: Any) -> AdaptiveConcurrencyConfig:
    """`adaptive_concurrency = { min = 1, max = 200, ... }` of a `[types.NAME]` table."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table such as {{ min = 1, max = 200 }}, not {raw!r}")
    known = {f.name: f for f in fields(AdaptiveConcurrencyConfig)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(known)})")
    settings: dict[str, Any] = {}
    for name, value in raw.items():
        inner = f"{where}.{name}"
        settings[name] = _coerce(inner, known[name].type, value)
        check(inner, known[name], settings[name])
    adaptive = replace(AdaptiveConcurrencyConfig(), **settings)
    if adaptive.min > adaptive.max:
        raise ConfigError(f"{where}: min ({adaptive.min}) must not be above max ({adaptive.max})")
    if adaptive.initial is not None and not adaptive.min <= adaptive.initial <= adaptive.max:
        raise ConfigError(
            f"{where}.initial: must be between min ({adaptive.min}) and max ({adaptive.max}), not {adaptive.initial}"
        )
    return adaptive


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
    read = {entry: _section(f"{name}.{entry}", cls, values, {}) for entry, values in tables.items()}
    for entry, table in read.items():
        if isinstance(table, TypeConfig) and table.local and table.adaptive_concurrency is not None:
            raise ConfigError(
                f"[{name}.{entry}] adaptive_concurrency: a local activity runs inline in its workflow "
                "task and is never claimed, so no concurrency limit applies to it"
            )
    return read


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Reads the TOML file (when given, or named by LOWTIDE_CONFIG) and applies the environment;
    a value a key does not accept raises ConfigError, one line naming the key. An unknown
    LOWTIDE_ variable is logged as a warning naming the closest known one."""
    env = os.environ if env is None else env
    _warn_unknown_variables(env)
    path = path or env.get("LOWTIDE_CONFIG") or None
    data = _read_toml(path) if path else {}
    unknown = set(data) - {*SECTIONS, "auth", "types", "signals", "queues", "pools", "resources"}
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(sorted(unknown))}")
    sections = {name: _section(name, cls, data.get(name, {}), env) for name, cls in SECTIONS.items()}
    check_margins(sections, lambda section, name: _where(section, name, env))
    resources = _resources(data)
    auth = _auth(_table_or_fail(data, "auth"), env)
    signals = _tables(data, "signals", SignalDefinition)
    pools = _tables(data, "pools", PoolConfig)
    _check_pool_signals(pools, {sections["cost"].signal, *signals})
    _check_priors(sections["signal"], signals)
    return Config(
        types=_tables(data, "types", TypeConfig),
        signals=signals,
        queues=_tables(data, "queues", QueueConfig),
        pools=pools,
        resources=resources,
        auth=auth,
        **sections,
    )


def _check_pool_signals(pools: Mapping[str, PoolConfig], known: set[str]) -> None:
    """A pool's signal is one this configuration defines: a pool bound to a name nothing feeds
    would be planned on no forecast, its work held for ever."""
    for name, pool in sorted(pools.items()):
        if pool.signal and pool.signal not in known:
            raise ConfigError(
                f"[pools.{name}] signal: no signal {pool.signal!r} is defined "
                f"(known: {', '.join(sorted(known))}; define it as [signals.{pool.signal}])"
            )


def _check_priors(base: SignalConfig, signals: Mapping[str, SignalDefinition]) -> None:
    """A signal's forecast error prior, with what it takes from `[signal]`, grows with the lead."""
    for name, definition in signals.items():
        at_1h, at_24h = definition.forecast_error_prior(base)
        if at_24h < at_1h:
            raise ConfigError(
                f"[signals.{name}] forecast_error_prior_24h: must be at least forecast_error_prior_1h "
                f"({at_1h:g}), not {at_24h:g}: the prior's error grows with the lead"
            )


def _table_or_fail(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{name}]: must be a table of keys, not {table!r}")
    return table


def _resources(data: Mapping[str, Any]) -> dict[str, int]:
    """`[resources]`: name = capacity, each a whole number."""
    resources: dict[str, int] = {}
    raw_resources = data.get("resources", {})
    if not isinstance(raw_resources, Mapping):
        raise ConfigError(f"[resources]: must be a table of name = capacity, not {raw_resources!r}")
    for name, capacity in raw_resources.items():
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 <= capacity <= INT32:
            raise ConfigError(f"[resources] {name}: must be a whole number from 0 to {INT32}, not {capacity!r}")
        resources[name] = capacity
    return resources
