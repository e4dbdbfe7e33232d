"""Hostile clients: each attack of tests/hostile/attacks.py against each service (both running as
real processes, auth on, on one fresh database), one at a time, with the canary of
tests/hostile/canary.py beside it (a subscriber, and a SetSignal and a SubmitTask every 0.25 s).
For each: the attacked service's CPU over the attack, its memory (RSS) before and at its peak,
the canary's latencies and failures, the changes the subscriber saw, and what the attacker sent
and got back."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench._pg import throwaway_database
from tests.hostile.attacks import ATTACKS
from tests.hostile.canary import run_attack, services

SECONDS = 5.0


async def hostile(server_url: str) -> dict[str, Any]:
    report: dict[str, Any] = {"seconds_per_attack": SECONDS, "canary_calls_every_s": 0.25}
    async with throwaway_database(server_url, "bench_hostile") as url:
        with tempfile.TemporaryDirectory() as workdir, services(url, Path(workdir)) as running:
            for attack in sorted(ATTACKS):
                report[attack] = {}
                for victim in ("signal", "scheduler"):
                    figures = await run_attack(running, attack, victim, seconds=SECONDS)
                    report[attack][victim] = figures.summary()
    return report
