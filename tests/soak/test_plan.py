"""The fault schedule is the seed's alone: the same seed replays it, another seed draws another."""

from __future__ import annotations

from collections import Counter

from soak.plan import plan_faults

WORKERS = ["worker-py-0", "worker-node-1", "worker-fixed-py"]


def plan(seed: int, duration: float = 1800) -> list[str]:
    faults = plan_faults(seed, duration, mean_gap=6, schedulers=["scheduler-1", "scheduler-2"], workers=WORKERS)
    return [str(f) for f in faults]


def test_the_same_seed_replays_the_same_faults() -> None:
    assert plan(7) == plan(7)
    assert plan(7) != plan(8)


def test_a_long_plan_has_a_few_hundred_faults_of_every_kind() -> None:
    faults = plan_faults(7, 1800, mean_gap=6, schedulers=["scheduler-1", "scheduler-2"], workers=WORKERS)
    assert 200 <= len(faults) <= 450
    assert all(0 <= f.at < 1800 for f in faults)
    kinds = Counter((f.kind, f.target.split("-")[0]) for f in faults)
    for kind in ("kill", "stop"):
        for target in ("scheduler", "worker", "signal", "postgres"):
            assert kinds[(kind, target)] > 0, (kind, target)
    assert kinds[("cut", "workers")] > 0
