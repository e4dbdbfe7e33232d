"""Where and when with a pool that has no signal of its own: it is planned on the signal each
task's type follows, whichever task comes first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lowtide.config import Config, PoolConfig
from scheduler_service.domain.holds import HoldConfig, HoldPolicy
from scheduler_service.domain.planning import Forecast, PlanTask
from scheduler_service.holds.cost import CostHolds
from scheduler_service.holds.regions import placed
from scheduler_service.holds.signals import SignalHolds

POOLS = {"eu-west": PoolConfig(signal="gb"), "on-prem": PoolConfig()}


def test_a_pool_without_a_signal_is_planned_on_the_one_each_tasks_type_follows() -> None:
    """on-prem follows the task's own signal: `train` follows the default grid (dirtier than
    Great Britain there), `render` a site price that is low all along. Placed together, train
    first, each goes where its own signal says (render went to eu-west, planned on train's)."""
    now = datetime.now(UTC)
    config = HoldConfig(frozenset({"train", "render"}), type_signals={"render": "site"}, pool_signals={"eu-west": "gb"})
    by_signal = {
        name: CostHolds(target="127.0.0.1:1", signal=name, policy=HoldPolicy(), config=config, on_release=lambda: None)
        for name in ("grid", "gb", "site")
    }
    hours = [now + timedelta(minutes=30 * i) for i in range(8)]
    for name, value in (("gb", 260.0), ("grid", 300.0), ("site", 40.0)):
        by_signal[name].forecast = Forecast.of((at, value) for at in hours)
    holds = SignalHolds(by_signal, default="grid", config=config)
    pools = ("eu-west", "on-prem")
    tasks = [
        (PlanTask(n, now, now + timedelta(hours=3), timedelta(minutes=30)), pools, None, "default", kind)
        for n, kind in enumerate(("train", "render"))
    ]
    train, render = placed(Config(pools=POOLS), holds.snapshot(), tasks, {"eu-west": 2, "on-prem": 2}, now)
    assert (train.region, render.region) == ("eu-west", "on-prem")


def test_a_pool_is_planned_with_the_caution_by_window_its_signal_learned() -> None:
    """Where the calibration found that a caution falling with the window pays, a task naming
    pools holds out by the window it has left, as a task naming none does."""
    now = datetime.now(UTC)
    config = HoldConfig(frozenset({"train"}), pool_signals={"eu-west": "gb"})
    gb = CostHolds(target="127.0.0.1:1", signal="gb", policy=HoldPolicy(), config=config, on_release=lambda: None)
    # 1 for a 4 h window, falling 0.5 a doubling: under 0 for a day's.
    gb.forecast_caution, gb.forecast_caution_slope = 1.0, 0.5
    west = [(now, 100.0, 0.0), *((now + timedelta(minutes=30 * i), 95.0, 0.1) for i in range(1, 60))]
    gb.forecast = Forecast.of(west)
    holds = SignalHolds({"gb": gb}, default="gb", config=config)
    tasks = [
        (PlanTask(n, now, now + timedelta(hours=h), timedelta(minutes=30)), ("eu-west",), None, "default", "train")
        for n, h in ((1, 4), (2, 24))
    ]
    short, long = placed(Config(pools=POOLS), holds.snapshot(), tasks, {"eu-west": 2}, now)
    assert (short.plan.release_at, long.plan.release_at) == (now, now + timedelta(minutes=30))
