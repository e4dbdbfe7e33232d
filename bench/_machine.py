"""What the numbers were measured on; throughput means little without it."""

from __future__ import annotations

import datetime
import os
import platform
import time
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


# The fixed work cpu_loop_ms times: about 0.1 s of one core on a 2020s server.
LOOP = 1_000_000


def cpu_loop_ms(tries: int = 5) -> dict[str, float]:
    """How long a fixed pure-Python loop takes, `tries` times in a row (min / median / max, ms).
    On a virtual machine whose cores other guests share, the same work can take twice as long
    from one second to the next, and every latency measured meanwhile drifts with it (the
    hypervisor need not report it as steal): a wide spread here says the figures beside it are
    the host's as much as the system's."""
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        total = 0
        for i in range(LOOP):
            total += i * i
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"min": round(times[0], 1), "median": round(times[len(times) // 2], 1), "max": round(times[-1], 1)}


async def describe_machine(server_url: str) -> dict[str, object]:
    return {
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "cpu_model": _cpu_model(),
        "postgresql": await server_version(server_url),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_loop_ms": cpu_loop_ms(),
    }
