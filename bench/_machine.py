"""What the numbers were measured on; throughput means little without it."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

from bench._pg import server_version


def _cpu_model() -> str:
    # /proc/cpuinfo is Linux-only; platform.processor() is often empty there but is the best
    # fallback elsewhere.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * page_size / 2**30, 1)


async def describe_machine(server_url: str) -> dict[str, object]:
    return {
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "cpu_model": _cpu_model(),
        "postgresql": await server_version(server_url),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
