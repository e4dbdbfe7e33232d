"""Configuration: a TOML file (`--config` or LOWTIDE_CONFIG), every key overridable from the
environment as LOWTIDE_<SECTION>_<KEY> (e.g. `[scheduler] listen` <- LOWTIDE_SCHEDULER_LISTEN,
`[database] url` <- LOWTIDE_DATABASE_URL). Durations are written `250ms`, `5s`, `10m`, `2h`.

Every key declares what it accepts next to its default (`key(default, rule)`), and
`load_config` checks each value against it at start-up: a value that would break a service
(a lease of 0s, a port of 99999, a NaN threshold) is refused with one line naming the key and
what it accepts.

- `schema`: the sections, one frozen dataclass each, with their keys' defaults and rules.
- `rules`: `key()`, the rules (`within`, `one_of`, addresses ...) and the margins between keys.
- `load`: the file and the environment, read, checked and turned into a `Config`.
"""

from lowtide.config.load import OTHER_VARIABLES, config_variables, load_config
from lowtide.config.rules import (
    MARGINS,
    Rule,
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
from lowtide.config.schema import (
    ROLES,
    SECTIONS,
    AdaptiveConcurrencyConfig,
    AuthConfig,
    Config,
    ConsoleConfig,
    CostConfig,
    DatabaseConfig,
    PoolConfig,
    QueueConfig,
    RetryConfig,
    SchedulerConfig,
    TlsConfig,
    TokenEntry,
    TypeConfig,
)
from lowtide.config.signals import (
    EMISSION_FACTORS,
    FEEDS,
    WATTTIME_SIGNALS,
    SignalConfig,
    SignalDefinition,
)

__all__ = [
    "EMISSION_FACTORS",
    "FEEDS",
    "MARGINS",
    "OTHER_VARIABLES",
    "ROLES",
    "SECTIONS",
    "WATTTIME_SIGNALS",
    "AdaptiveConcurrencyConfig",
    "AuthConfig",
    "Config",
    "ConsoleConfig",
    "CostConfig",
    "DatabaseConfig",
    "PoolConfig",
    "QueueConfig",
    "RetryConfig",
    "Rule",
    "SchedulerConfig",
    "SignalConfig",
    "SignalDefinition",
    "TlsConfig",
    "TokenEntry",
    "TypeConfig",
    "config_variables",
    "database_url",
    "finite",
    "grpc_target",
    "key",
    "listen_address",
    "listen_address_or_off",
    "load_config",
    "not_empty",
    "one_of",
    "within",
]
