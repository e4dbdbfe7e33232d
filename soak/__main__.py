"""`python -m soak [--duration 3m] [--seed N] [--load 10] [--fault-every 6s] [--out DIR]`:
exits 0 when every invariant held, 1 on any violation."""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import re
import sys
import tempfile
from pathlib import Path

from soak.run import run
from soak.stack import Settings

_UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds(text: str) -> float:
    """`90`, `90s`, `30m` or `1h` as seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 30m or 1h, not {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__)
    parser.add_argument("--duration", type=seconds, default=seconds("3m"), help="how long faults and load run")
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (default: a random one)")
    parser.add_argument("--load", type=float, default=10.0, help="load operations a second")
    parser.add_argument("--fault-every", type=seconds, default=seconds("6s"), help="the mean time between faults")
    parser.add_argument("--no-node", action="store_true", help="no Node workers")
    parser.add_argument("--no-go", action="store_true", help="no Go worker (built where Go is installed)")
    parser.add_argument("--out", type=Path, default=None, help="where logs and records go (default: a new temp folder)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1, 1_000_000)
    folder = args.out or Path(tempfile.mkdtemp(prefix=f"lowtide-soak-{seed}-"))
    logging.basicConfig(level=logging.WARNING)
    workers = {"node": not args.no_node, "go": not args.no_go}
    settings = Settings(args.duration, seed, args.load, args.fault_every, folder, **workers)
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
