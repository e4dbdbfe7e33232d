"""Logging with stable event names.

Every record's message starts with an event name such as ``worker.connected``, followed by
``key=value`` pairs. The name is the stable part: alerts and log queries match on it, while
the fields may grow. The same name and fields are also attached to the record as
``lowtide_event`` and ``lowtide_fields`` for structured (e.g. JSON) formatters.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("lowtide_client")


def log_event(level: int, event: str, /, *, exc_info: bool = False, **fields: object) -> None:
    """Log ``event`` with ``fields`` at ``level`` on the ``lowtide_client`` logger."""
    if not logger.isEnabledFor(level):
        return
    template = " ".join([event, *(f"{key}=%s" for key in fields)])
    logger.log(
        level,
        template,
        *fields.values(),
        exc_info=exc_info,
        extra={"lowtide_event": event, "lowtide_fields": fields},
    )
