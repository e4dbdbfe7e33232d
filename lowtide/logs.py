"""Structured logs: a stable event name as the message, fields from `extra`.

Plain `key=value` lines by default; one JSON object per line when LOWTIDE_LOG_FORMAT=json.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    # lowtide_client puts its event and fields into the message already (it logs without us).
    return {
        k: v
        for k, v in record.__dict__.items()
        if k not in _STANDARD and not k.startswith("_") and k not in ("lowtide_event", "lowtide_fields")
    }


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [self.formatTime(record), record.levelname.lower(), record.name, record.getMessage()]
        parts += [f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}" for k, v in _fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(level: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    json_logs = os.environ.get("LOWTIDE_LOG_FORMAT", "").lower() == "json"
    handler.setFormatter(JsonFormatter() if json_logs else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("LOWTIDE_LOG_LEVEL") or "INFO").upper())
    # httpx logs every request at INFO with its full URL, and the entsoe feed's security token is a
    # query parameter: the feeds log their own failures, without it.
    logging.getLogger("httpx").setLevel(logging.WARNING)
