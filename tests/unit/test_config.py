"""Configuration: TOML, environment overrides, and clear errors."""

from __future__ import annotations

import logging
import re
from dataclasses import Field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from lowtide.config import (
    FEEDS,
    OTHER_VARIABLES,
    SECTIONS,
    AdaptiveConcurrencyConfig,
    AuthConfig,
    PoolConfig,
    QueueConfig,
    SignalDefinition,
    TypeConfig,
    config_variables,
    load_config,
)
from lowtide.errors import ConfigError


def test_toml_values_and_environment_overrides(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text('[scheduler]\npoll_interval = "250ms"\n\n[types.train]\nmax_concurrency = 2\n')
    config = load_config(
        path, env={"LOWTIDE_SCHEDULER_LISTEN": "0.0.0.0:6000", "LOWTIDE_DATABASE_URL": "postgresql://db.example/x"}
    )
    assert config.scheduler.poll_interval == timedelta(milliseconds=250)
    assert config.scheduler.listen == "0.0.0.0:6000"
    assert config.database.url == "postgresql://db.example/x"
    assert config.types["train"].max_concurrency == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[scheduler]\npoll_interval = "soon"\n', "[scheduler] poll_interval"),
        ("[scheduler]\npoll = 1\n", "unknown key(s) poll"),
        ("[nope]\n", "unknown section(s) nope"),
        ("[types.x]\nmax_concurrency = 0\n", "[types.x] max_concurrency"),
        ("[types.x]\nadaptive_concurrency = { min = 0 }\n", "[types.x] adaptive_concurrency.min: must be between 1"),
        ("[types.x]\nadaptive_concurrency = { min = 9, max = 3 }\n", "min (9) must not be above max (3)"),
        ("[types.x]\nadaptive_concurrency = { maxx = 3 }\n", "adaptive_concurrency: unknown key(s) maxx"),
        ("[types.x]\nadaptive_concurrency = 20\n", "adaptive_concurrency: must be a table"),
        ("[types.x]\nadaptive_concurrency = { initial = 300 }\n", "initial: must be between min (1) and max (200)"),
        ('[types.x]\nadaptive_concurrency = { probe = "soon" }\n', "adaptive_concurrency.probe"),
        ("[types.x]\nlocal = true\nadaptive_concurrency = {}\n", "a local activity runs inline"),
        ("[signals.de]\nforecast_error_prior_1h = 1.5\n", "[signals.de] forecast_error_prior_1h: must be between 0"),
        (
            "[signals.de]\nforecast_error_prior_1h = 0.2\n",
            "[signals.de] forecast_error_prior_24h: must be at least forecast_error_prior_1h (0.2), not 0.15",
        ),
    ],
)
def test_bad_config_is_refused_with_the_key_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert message in str(caught.value)


# One case per rule: a variable and its value, and what the one-line error must say.
BAD_VALUES = [
    ("LOWTIDE_SCHEDULER_LEASE_TIMEOUT", "0s", "[scheduler] lease_timeout): must be between 1s and 1h, not 0s"),
    ("LOWTIDE_SCHEDULER_LEASE_TIMEOUT", "3s", "must be at least 2 x [scheduler] heartbeat_interval (4s), not 3s"),
    ("LOWTIDE_SCHEDULER_HEARTBEAT_INTERVAL", "0s", "[scheduler] heartbeat_interval): must be between 100ms and 5m"),
    ("LOWTIDE_SCHEDULER_RECONNECT_GRACE", "2h", "[scheduler] reconnect_grace): must be between 0s and 1h, not 2h"),
    ("LOWTIDE_SCHEDULER_RECONNECT_GRACE", "11s", "lease_timeout: must be at least [scheduler] reconnect_grace (11s)"),
    ("LOWTIDE_SCHEDULER_POLL_INTERVAL", "0s", "[scheduler] poll_interval): must be between 50ms and 10m, not 0s"),
    ("LOWTIDE_SCHEDULER_MAINTENANCE_INTERVAL", "0s", "[scheduler] maintenance_interval): must be between 10ms"),
    ("LOWTIDE_SCHEDULER_LEADER_LEASE", "500ms", "[scheduler] leader_lease): must be between 1s and 10m"),
    ("LOWTIDE_SCHEDULER_METRICS_INTERVAL", "0s", "[scheduler] metrics_interval): must be between 100ms and 1h"),
    ("LOWTIDE_SCHEDULER_LISTEN", "127.0.0.1:99999", "with a port from 0 to 65535 (e.g. 127.0.0.1:50051), not"),
    ("LOWTIDE_SCHEDULER_LISTEN", "127.0.0.1", "[scheduler] listen): must be host:port"),
    ("LOWTIDE_SCHEDULER_LISTEN", "::1:5000", "an IPv6 host in brackets"),
    ("LOWTIDE_SCHEDULER_METRICS_LISTEN", "0.0.0.0:http", "[scheduler] metrics_listen): must be host:port with a port"),
    ("LOWTIDE_SCHEDULER_SIGNAL_TARGET", "", "[scheduler] signal_target): must not be empty"),
    ("LOWTIDE_SCHEDULER_SIGNAL_TARGET", "signal:0", "[scheduler] signal_target): must be host:port with a port from 1"),
    ("LOWTIDE_SCHEDULER_MAX_PAYLOAD_BYTES", "-1", "[scheduler] max_payload_bytes): must be between 0 and 2147483647"),
    ("LOWTIDE_SCHEDULER_MAX_PAYLOAD_BYTES", "1.5", "[scheduler] max_payload_bytes): must be a whole number, not '1.5'"),
    ("LOWTIDE_SCHEDULER_MAX_PAYLOAD_BYTES", "100000000", "must be at least [scheduler] max_payload_bytes (100000000)"),
    ("LOWTIDE_SCHEDULER_MAX_BATCH_TASKS", "0", "[scheduler] max_batch_tasks): must be between 1 and 1000000"),
    ("LOWTIDE_SCHEDULER_MAX_MESSAGE_BYTES", "3000000000", "[scheduler] max_message_bytes): must be between 65536"),
    ("LOWTIDE_SCHEDULER_MAX_CONCURRENT_STREAMS", "0", "[scheduler] max_concurrent_streams): must be between 1"),
    ("LOWTIDE_RETRY_MAX_ATTEMPTS", "0", "[retry] max_attempts): must be between 1 and 10000, not 0"),
    ("LOWTIDE_RETRY_BACKOFF_COEFFICIENT", "0.1", "[retry] backoff_coefficient): must be between 1 and 100, not 0.1"),
    ("LOWTIDE_RETRY_BACKOFF_COEFFICIENT", "inf", "[retry] backoff_coefficient): must be a finite number"),
    ("LOWTIDE_RETRY_INITIAL_BACKOFF", "2m", "[retry] max_backoff: must be at least [retry] initial_backoff (2m)"),
    ("LOWTIDE_RETRY_MAX_BACKOFF", "9000h", "[retry] max_backoff): must be between 0s and 8784h"),
    ("LOWTIDE_DATABASE_URL", "garbage", "LOWTIDE_DATABASE_URL ([database] url): not a PostgreSQL URL"),
    ("LOWTIDE_DATABASE_URL", "postgresql://db:99999/x", "the port must be a number from 1 to 65535, not '99999'"),
    ("LOWTIDE_DATABASE_POOL_MIN", "20", "[database] pool_max: must be at least [database] pool_min (20), not 16"),
    ("LOWTIDE_DATABASE_POOL_MAX", "0", "[database] pool_max): must be between 1 and 1000, not 0"),
    ("LOWTIDE_DATABASE_POOL_MIN", "many", "[database] pool_min): must be a whole number, not 'many'"),
    ("LOWTIDE_COST_DEFER_THRESHOLD", "nan", "[cost] defer_threshold): must be a finite number, not nan"),
    ("LOWTIDE_COST_DEFER_THRESHOLD", "-inf", "[cost] defer_threshold): must be a finite number, not -inf"),
    ("LOWTIDE_COST_DEFER_THRESHOLD", "high", "[cost] defer_threshold): must be a number, not 'high'"),
    ("LOWTIDE_COST_RELEASE_BELOW", "nan", "[cost] release_below): must be a finite number"),
    ("LOWTIDE_COST_HOLD_RECHECK", "0s", "[cost] hold_recheck): must be between 10ms and 1h"),
    ("LOWTIDE_COST_MIN_HOLD", "25h", "[cost] min_hold): must be between 0s and 24h"),
    ("LOWTIDE_COST_ON_STALE", "maybe", "[cost] on_stale): must be one of 'hold', 'release', not 'maybe'"),
    ("LOWTIDE_COST_SIGNAL", "", "[cost] signal): must not be empty"),
    ("LOWTIDE_SIGNAL_LISTEN", "localhost:-1", "[signal] listen): must be host:port with a port from 0 to 65535"),
    ("LOWTIDE_SIGNAL_FEED", "ukci", "[signal] feed): must be one of 'static', 'replay', 'recorded', 'uk-"),
    ("LOWTIDE_SIGNAL_STALE_AFTER", "0s", "[signal] stale_after): must be between 1s and 8784h"),
    ("LOWTIDE_SIGNAL_REFRESH", "0s", "[signal] refresh): must be between 100ms and 24h"),
    ("LOWTIDE_SIGNAL_REPLAY_SPEED", "0", "[signal] replay_speed): must be above 0 and at most 1e+09, not 0"),
    ("LOWTIDE_SIGNAL_REPLAY_FORECAST_ERROR", "-0.1", "[signal] replay_forecast_error): must be between 0 and 1"),
    ("LOWTIDE_SIGNAL_FORECAST_ERROR_PRIOR_24H", "2", "[signal] forecast_error_prior_24h): must be between 0 and 1"),
    (
        "LOWTIDE_SIGNAL_FORECAST_ERROR_PRIOR_1H",
        "0.2",
        "[signal] forecast_error_prior_24h: must be at least [signal] forecast_error_prior_1h (0.2), not 0.15",
    ),
    ("LOWTIDE_SIGNAL_TIMEOUT", "0s", "[signal] timeout): must be between 100ms and 10m"),
    ("LOWTIDE_SIGNAL_REPLAY_LOOP", "sometimes", "[signal] replay_loop): not a boolean: 'sometimes'"),
    ("LOWTIDE_SIGNAL_EMISSION_FACTOR", "LCA", "[signal] emission_factor): must be one of 'lifecycle', 'direct'"),
    ("LOWTIDE_SIGNAL_WATTTIME_SIGNAL", "percent", "[signal] watttime_signal): must be one of 'index', 'moer'"),
]


@pytest.mark.parametrize(("variable", "value", "message"), BAD_VALUES, ids=[f"{v}={x}" for v, x, _ in BAD_VALUES])
def test_a_value_that_would_break_a_service_is_refused_naming_the_key_and_range(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={variable: value})
    text = str(caught.value)
    assert message in text
    assert "\n" not in text


# The same rules for values from the file; the sections without environment overrides too.
BAD_TOML = [
    ("[scheduler]\nlease_timeout = 10\n", "[scheduler] lease_timeout: invalid duration '10': missing unit"),
    ('[scheduler]\nlease_timeout = "0s"\n', "[scheduler] lease_timeout: must be between 1s and 1h, not 0s"),
    ("[cost]\ndefer_threshold = nan\n", "[cost] defer_threshold: must be a finite number, not nan"),
    ("[scheduler]\nmax_payload_bytes = true\n", "[scheduler] max_payload_bytes: must be a whole number, not True"),
    ("[scheduler]\nmax_payload_bytes = 1.5\n", "[scheduler] max_payload_bytes: must be a whole number, not 1.5"),
    ("[database]\npool_min = 8\npool_max = 4\n", "[database] pool_max: must be at least [database] pool_min (8)"),
    ("[types.x]\nmax_concurrency = 0\n", "[types.x] max_concurrency: must be between 1 and 1000000, not 0"),
    ('[types.x]\nmax_defer = "0s"\n', "[types.x] max_defer: must be above 0s and at most 8784h, not 0s"),
    ('[types.x]\nestimated_duration = "400d"\n', "estimated_duration: must be above 0s and at most 8784h, not 9600h"),
    ('[types.x]\nestimated_duration = "4 days"\n', "[types.x] estimated_duration: invalid duration"),
    ("[pools.gpu]\nmax_workers = 0\n", "[pools.gpu] max_workers: must be between 1 and 1000000, not 0"),
    ("[pools.gpu]\nreservable_fraction = 0.0\n", "[pools.gpu] reservable_fraction: must be above 0 and at most 1"),
    ("[pools.gpu]\nreservable_fraction = 1.5\n", "[pools.gpu] reservable_fraction: must be above 0 and at most 1"),
    ('[pools.gpu]\nmax_hold = "25h"\n', "[pools.gpu] max_hold: must be between 0s and 24h"),
    ('[pools.eu]\nsignal = "de"\n', "[pools.eu] signal: no signal 'de' is defined (known: grid;"),
    ("[queues.q]\nmax_depth = 0\n", "[queues.q] max_depth: must be between 1 and"),
    ('[queues.q]\noverflow = "drop"\n', "[queues.q] overflow: must be one of 'reject', 'shed_lowest', 'shed_oldest'"),
    ("[signals.price]\nthreshold = inf\n", "[signals.price] threshold: must be a finite number, not inf"),
    ("[resources]\ngpu = -1\n", "[resources] gpu: must be a whole number from 0 to 2147483647, not -1"),
    ("scheduler = 5\n", "[scheduler]: must be a table of keys, not 5"),
    ("types = 5\n", "[types]: must be tables such as [types.NAME], not 5"),
    ("[types]\nx = 5\n", "[types.x]: must be a table of keys, not 5"),
    ("auth = 5\n", "[auth]: must be a table of keys, not 5"),
    ("[scheduler]\nlisten = [1]\n", "[scheduler] listen: must be a string"),
    ("[scheduler\n", "not valid TOML: Expected ']'"),
    ('[signal]\nemission_factor = "operational"\n', "[signal] emission_factor: must be one of 'lifecycle', 'direct'"),
    ('[signal]\nwatttime_signal = "MOER"\n', "[signal] watttime_signal: must be one of 'index', 'moer', not 'MOER'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_TOML, ids=[t.replace("\n", " ") for t, _ in BAD_TOML])
def test_a_bad_value_in_the_file_is_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_file_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_bytes(b'[signal]\nunit = "g\xe9"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert str(caught.value) == f"config file {path}: not UTF-8 text (byte 0xe9 at offset 18)"


def test_the_database_url_error_does_not_repeat_a_password() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={"LOWTIDE_DATABASE_URL": "postgresql://app:hunter2@[::1/db"})
    assert "LOWTIDE_DATABASE_URL" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_good_values_at_the_edges_are_accepted() -> None:
    config = load_config(
        env={
            "LOWTIDE_SCHEDULER_LISTEN": "[::1]:0",
            "LOWTIDE_SCHEDULER_METRICS_LISTEN": "",
            "LOWTIDE_SCHEDULER_SIGNAL_TARGET": "dns:///signal.internal:50052",
            "LOWTIDE_SCHEDULER_LEASE_TIMEOUT": "4s",
            "LOWTIDE_SCHEDULER_POLL_INTERVAL": "50ms",
            "LOWTIDE_COST_DEFER_THRESHOLD": "-20.5",
            "LOWTIDE_DATABASE_URL": "host=db port=5432 dbname=lowtide",
            "LOWTIDE_DATABASE_POOL_MIN": "16",
        }
    )
    assert config.scheduler.lease_timeout == timedelta(seconds=4)
    assert config.cost.defer_threshold == -20.5
    assert config.database.pool_min == config.database.pool_max == 16


def _all_key_fields() -> list[tuple[str, Field[Any]]]:
    classes = [
        *SECTIONS.values(),
        AuthConfig,
        TypeConfig,
        AdaptiveConcurrencyConfig,
        PoolConfig,
        QueueConfig,
        SignalDefinition,
    ]
    return [(f"{cls.__name__}.{f.name}", f) for cls in classes for f in fields(cls)]


@pytest.mark.parametrize(("name", "spec"), _all_key_fields(), ids=[name for name, _ in _all_key_fields()])
def test_every_number_and_duration_key_declares_its_range(name: str, spec: Field[Any]) -> None:
    kind = str(spec.type).removesuffix(" | None")
    if kind in ("int", "float", "timedelta"):
        assert spec.metadata.get("lowtide.rule"), f"{name}: declare what it accepts, e.g. key(default, within(...))"
    rule = spec.metadata.get("lowtide.rule")
    if rule is not None and spec.default is not None:
        assert rule(spec.default) is None, f"{name}: the default breaks its own rule"


def test_the_feeds_the_config_accepts_are_those_the_signal_service_has() -> None:
    from signal_service.feeds import FEEDS as SERVICE_FEEDS

    assert FEEDS == SERVICE_FEEDS


def test_an_unknown_lowtide_variable_is_warned_about_naming_the_closest_key(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "LOWTIDE_SCHEDULER_LISTNE": "0.0.0.0:6000",
        "LOWTIDE_POOLS_GPU_MAX_WORKERS": "4",
        **dict.fromkeys(OTHER_VARIABLES - {"LOWTIDE_CONFIG"}, "1"),
        "LOWTIDE_AUTH": "off",
        "LOWTIDE_SIGNAL_FEED": "static",
    }
    with caplog.at_level(logging.WARNING, logger="lowtide.config"):
        config = load_config(env=env)
    assert config.scheduler.listen == "127.0.0.1:50051"
    warned = {r.__dict__["variable"]: r.__dict__["did_you_mean"] for r in caplog.records}
    assert warned["LOWTIDE_SCHEDULER_LISTNE"] == "LOWTIDE_SCHEDULER_LISTEN"
    # Only the two that lowtide does not read: none of the known other variables.
    assert set(warned) == {"LOWTIDE_SCHEDULER_LISTNE", "LOWTIDE_POOLS_GPU_MAX_WORKERS"}
    assert all(r.getMessage() == "config.unknown_variable" for r in caplog.records)


_REPO = Path(__file__).resolve().parents[2]
_VARIABLE = re.compile(r"\bLOWTIDE_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


def test_every_lowtide_variable_the_code_reads_is_known() -> None:
    # A variable that lowtide itself (or its clients, tests and benchmarks) uses must never be
    # warned about as a typo: it is a configuration key or in OTHER_VARIABLES.
    places = [
        "lowtide",
        "scheduler_service",
        "signal_service",
        "clients/python/lowtide_client",
        "clients/python/lowtide_proto",
        "tests",
        "bench",
    ]
    files = [p for place in places for p in (_REPO / place).rglob("*.py")]
    files += [p for p in (_REPO / "clients" / "node").rglob("*.js") if "node_modules" not in p.parts]
    files += [_REPO / "docker-compose.yml", _REPO / "Dockerfile"]
    seen = {name for path in files if path.is_file() for name in _VARIABLE.findall(path.read_text())}
    examples = {"LOWTIDE_SCHEDULER_LISTNE", "LOWTIDE_POOLS_GPU_MAX_WORKERS"}
    assert seen - examples - config_variables() - OTHER_VARIABLES == set()


def test_adaptive_concurrency_is_read_from_an_inline_table(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text('[types.api]\nadaptive_concurrency = { min = 2, max = 50, initial = 5, probe = "30s" }\n')
    adaptive = load_config(path, env={}).types["api"].adaptive_concurrency
    assert adaptive == AdaptiveConcurrencyConfig(min=2, max=50, initial=5, probe=timedelta(seconds=30))


def test_durations_are_written_in_days_too(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text('[scheduler]\nretention = "7d"\n')
    assert load_config(path, env={}).scheduler.retention == timedelta(days=7)
    assert load_config(None, env={"LOWTIDE_SCHEDULER_RETENTION": "1d12h"}).scheduler.retention == timedelta(hours=36)


def test_a_pool_is_bound_to_a_signal_the_configuration_defines(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text(
        '[signals.de]\nthreshold = 300.0\n\n[pools.eu-central]\nsignal = "de"\n\n[pools.eu-west]\nsignal = "grid"\n'
    )
    config = load_config(path, env={})
    assert config.pool("eu-central").signal == "de"
    assert config.pool("eu-west").signal == "grid"
    assert config.pool("other").signal == ""
