"""The sections of lowtide's configuration: one frozen dataclass per section (`[scheduler]`,
`[types.NAME]` ...), each key declared with its default and what it accepts (`key(default,
rule)`, see `lowtide.config.rules`). Comments beside a key say what it does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from lowtide.config.rules import (
    DAY,
    INT32,
    LONGEST,
    MIN,
    MS,
    H,
    S,
    database_url,
    finite,
    grpc_target,
    key,
    listen_address,
    listen_address_or_off,
    not_empty,
    one_of,
    within,
)
from lowtide.config.signals import (
    SignalConfig,
    SignalDefinition,
)


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
    poll_interval: timedelta = key(500 * MS, within(50 * MS, 10 * MIN))
    # Workers send a heartbeat this often; silence for lease_timeout loses them their tasks.
    heartbeat_interval: timedelta = key(2 * S, within(100 * MS, 5 * MIN))
    lease_timeout: timedelta = key(10 * S, within(1 * S, 1 * H))
    # Workers that run nothing send a heartbeat this often (Welcome.idle_heartbeat_interval);
    # one not heard from for this plus lease_timeout is given no more work.
    idle_heartbeat_interval: timedelta = key(30 * S, within(100 * MS, 1 * H))
    # A worker whose stream is cut (the network, a proxy, a killed process: the scheduler cannot
    # tell which) keeps its running attempts this long for its reconnect to take back; 0 gives
    # them up at once. A stream the worker closed, or the scheduler ended, is never waited for.
    reconnect_grace: timedelta = key(0 * S, within(0 * S, 1 * H))
    # Time-driven work (timeouts, lost leases) runs this often, on the leader only.
    maintenance_interval: timedelta = key(500 * MS, within(10 * MS, 1 * MIN))
    leader_lease: timedelta = key(5 * S, within(1 * S, 10 * MIN))
    # Finished tasks (their results, errors and idempotency keys) are deleted this long after they
    # finished; 0 keeps them for ever.
    retention: timedelta = key(7 * DAY, within(0 * S, 10 * LONGEST))
    max_payload_bytes: int = key(1024 * 1024, within(0, INT32))
    max_batch_tasks: int = key(10_000, within(1, 1_000_000))
    max_message_bytes: int = key(16 * 1024 * 1024, within(64 * 1024, INT32))
    # Concurrent streams (calls) one client connection may have open: beyond it a client's
    # further calls wait for its own to finish instead of crowding out the others. Note that
    # grpc shares one connection between the channels a process opens to the same target.
    max_concurrent_streams: int = key(10_000, within(1, INT32))
    # The signal service the scheduler subscribes to for cost holds.
    signal_target: str = key("127.0.0.1:50052", grpc_target)
    # Prometheus /metrics (empty: not served).
    metrics_listen: str = key("127.0.0.1:9464", listen_address_or_off)
    # How often queue figures (depth, held depth, ages) are read from the database.
    metrics_interval: timedelta = key(5 * S, within(100 * MS, 1 * H))
    # Task metrics are labelled by queue and activity type: the configured ones, then the first
    # this many others seen (per label); later ones are counted as "other".
    metrics_label_values: int = key(50, within(0, 10_000))
    # Adaptive concurrency: how often replicas write their samples and the leader moves the limits.
    adaptive_window: timedelta = key(1 * S, within(100 * MS, 1 * MIN))


@dataclass(frozen=True)
class RetryConfig:
    """Defaults for a task whose retry policy leaves a field unset."""

    # The bounds a task's own retry policy has too (scheduler_service.wire.inbound).
    max_attempts: int = key(3, within(1, 10_000))
    initial_backoff: timedelta = key(1 * S, within(timedelta(0), LONGEST))
    backoff_coefficient: float = key(2.0, within(1.0, 100.0))
    max_backoff: timedelta = key(1 * MIN, within(timedelta(0), LONGEST))


@dataclass(frozen=True)
class AdaptiveConcurrencyConfig:
    """`[types.NAME] adaptive_concurrency = { min = 1, max = 200, ... }`: the limit the scheduler
    moves from what the type's attempts show (scheduler_service.domain.adaptive)."""

    min: int = key(1, within(1, 1_000_000))
    max: int = key(200, within(1, 1_000_000))
    # Where the limit starts before the type has one in the database (unset: min).
    initial: int | None = key(None, within(1, 1_000_000))
    # Attempts a window needs to move the limit; fewer gather into the next window.
    min_samples: int = key(10, within(1, 1_000_000))
    # A failure rate (retryable errors and timeouts) up to this is noise, not overload.
    tolerance: float = key(0.02, within(0.0, 1.0))
    # On failures the limit falls at least to limit x backoff (and at most by half).
    backoff: float = key(0.9, within(0.5, 1.0))
    # How often the no-load run time (the baseline) is measured again.
    probe: timedelta = key(1 * MIN, within(1 * S, 1 * DAY))


@dataclass(frozen=True)
class TypeConfig:
    """Per activity type settings, from `[types.NAME]`."""

    max_concurrency: int | None = key(None, within(1, 1_000_000))
    # A limit moved by the type's latency and failures; with max_concurrency too, the lower wins.
    adaptive_concurrency: AdaptiveConcurrencyConfig | None = None
    # A local activity runs inline in a workflow task and is never queued: no hold may name it.
    local: bool = False
    # A cost hold defers tasks of this type at most this long (unless the task sets its own).
    max_defer: timedelta | None = key(None, within(timedelta(0), LONGEST, above=True))
    # The signal whose hold holds this type where it is deferrable (`[signals.NAME]`, with its
    # threshold); empty: its queue's signal, else the default one ([cost] signal).
    signal: str = ""
    # A default the submitter's own schedule_to_start overrides; on a held type it warns.
    schedule_to_start: timedelta | None = key(None, within(timedelta(0), LONGEST, above=True))
    # For fixed starts that do not give their own estimated_duration.
    estimated_duration: timedelta | None = key(None, within(timedelta(0), LONGEST, above=True))


@dataclass(frozen=True)
class PoolConfig:
    """Per pool settings, from `[pools.NAME]`; a pool not configured gets these defaults."""

    max_workers: int = key(1, within(1, 1_000_000))
    # At most max(1, floor(max_workers x reservable_fraction)) reservations may overlap.
    reservable_fraction: float = key(0.5, within(0.0, 1.0, above=True))
    # The longest a slot is held idle before a fixed start (and when holding is first checked).
    max_hold: timedelta = key(5 * MIN, within(timedelta(0), 1 * DAY))
    # Reservations starting within this horizon count in the pool's desired workers.
    autoscale_horizon: timedelta = key(10 * MIN, within(timedelta(0), LONGEST))
    # The signal of the pool's grid (`[signals.NAME]` or the default, [cost] signal): a task that
    # names several pools is planned on each one's forecast and released where and when it is
    # cheapest (docs/how-to/regions.md). Empty: the signal its work follows anyway.
    signal: str = ""


@dataclass(frozen=True)
class QueueConfig:
    """Per queue settings, from `[queues.NAME]`."""

    # Held while the cost signal is high, on this queue only (beside [cost] deferrable_activities).
    deferrable_activities: tuple[str, ...] = ()
    # The signal whose hold holds the deferrable types on this queue that name none of their own
    # (`[types.NAME] signal`); empty: the default one ([cost] signal).
    signal: str = ""
    # Overload: at most this many claimable pending tasks (held work and fixed starts not
    # counted); beyond it `overflow` applies: reject, shed_lowest or shed_oldest.
    max_depth: int | None = key(None, within(1, 2**62))
    overflow: str = key("reject", one_of("reject", "shed_lowest", "shed_oldest"))


@dataclass(frozen=True)
class CostConfig:
    # The default signal: the one the feed drives and the scheduler's cost holds read.
    signal: str = key("grid", not_empty)
    # Any finite value: a price signal may well be negative.
    defer_threshold: float = key(400.0, finite)
    # Activity types held on every queue while the signal is high.
    deferrable_activities: tuple[str, ...] = ()
    # A parked dispatch reference of a held type is looked at again after this long.
    hold_recheck: timedelta = key(5 * S, within(10 * MS, 1 * H))
    # Hysteresis (optional): once on, the hold ends only below release_below ...
    release_below: float | None = key(None, finite)
    # ... and not before it has lasted min_hold.
    min_hold: timedelta = key(timedelta(0), within(timedelta(0), 1 * DAY))
    # What a stale signal means to the scheduler: "hold" (the default) or "release".
    on_stale: str = key("hold", one_of("hold", "release"))


@dataclass(frozen=True)
class ConsoleConfig:
    """The web console (`lowtide console`): a client of both services' gRPC APIs."""

    # Empty: `lowtide up` starts no console.
    listen: str = key("127.0.0.1:8080", listen_address_or_off)
    scheduler_target: str = key("127.0.0.1:50051", grpc_target)
    signal_target: str = key("127.0.0.1:50052", grpc_target)
    # How often an open page asks for fresh numbers.
    refresh: timedelta = key(3 * S, within(500 * MS, 1 * MIN))


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
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    types: Mapping[str, TypeConfig] = field(default_factory=dict)
    signals: Mapping[str, SignalDefinition] = field(default_factory=dict)
    queues: Mapping[str, QueueConfig] = field(default_factory=dict)
    pools: Mapping[str, PoolConfig] = field(default_factory=dict)
    # Named capacities from `[resources]` (gpu = 2): tasks ask for amounts of them.
    resources: Mapping[str, int] = field(default_factory=dict)

    def pool(self, name: str) -> PoolConfig:
        return self.pools.get(name) or PoolConfig()


# The sections of plain keys, read alike from the file and the environment (`[auth]` has its
# list of tokens, the named tables are read from the file only).
SECTIONS: dict[str, type[Any]] = {
    "database": DatabaseConfig,
    "scheduler": SchedulerConfig,
    "retry": RetryConfig,
    "signal": SignalConfig,
    "cost": CostConfig,
    "tls": TlsConfig,
    "console": ConsoleConfig,
}

# The roles a token may have (`[[auth.tokens]]` role).
ROLES = ("worker", "submitter", "viewer", "admin")
