"""The overview's regions, as pure functions: each pool bound to a signal with its signal against
its threshold, its workers, and the held tasks placed there with the next release."""

from __future__ import annotations

import re

from lowtide.console import regions
from lowtide.console.backend import SignalView
from lowtide_proto.lowtide.v1 import scheduler_pb2, signal_pb2, task_pb2

NOW = 1_800_000_000.0


def _task(task_id: int, pool: str, at: float | None, intensity: float | None = None) -> task_pb2.Task:
    task = task_pb2.Task(id=task_id, planned_pool=pool)
    if at is not None:
        task.planned_release_at.FromSeconds(int(at))
    if intensity is not None:
        task.planned_intensity = intensity
    return task


def _signal(name: str, threshold: float, values: list[float]) -> SignalView:
    history = [signal_pb2.SignalPoint(value=v) for v in values]
    for i, point in enumerate(history):
        point.at.FromSeconds(int(NOW) - 600 * (len(values) - i))
    forecast = [signal_pb2.SignalPoint(value=v, expected_error=0.05) for v in values]
    for i, point in enumerate(forecast):
        point.at.FromSeconds(int(NOW) + 600 * i)
    state = signal_pb2.SignalState(name=name, threshold=threshold, unit="gCO2/kWh", value=values[-1])
    return SignalView(state, history, forecast)


def _status() -> scheduler_pb2.GetStatusResponse:
    return scheduler_pb2.GetStatusResponse(
        pools=[
            scheduler_pb2.PoolStatus(name="default"),
            scheduler_pb2.PoolStatus(
                name="eu-west", signal="gb", signal_value=260, workers=2, slots=4, busy_slots=1, planned_releases=0
            ),
            scheduler_pb2.PoolStatus(name="eu-central", signal="de", signal_value=300, planned_releases=3),
            scheduler_pb2.PoolStatus(name="ap-south", signal="in"),
        ]
    )


def test_each_pool_bound_to_a_signal_is_a_region_with_its_own_planned_releases() -> None:
    pending = [
        _task(7, "eu-central", NOW + 1200, 150.0),
        _task(5, "eu-central", NOW + 600, 140.0),
        _task(6, "eu-west", None),  # placed, but no release planned: not a release
        _task(8, "", NOW + 300),  # planned on a signal, in no pool
    ]
    signals = {"gb": _signal("gb", 250, [260.0] * 3), "de": _signal("de", 250, [300.0, 150.0, 300.0])}
    found = {r.pool: r for r in regions.regions(_status(), pending, signals, now=NOW)}

    # The pool bound to no signal is not a region; one whose signal the console does not read is,
    # without a chart or threshold.
    assert sorted(found) == ["ap-south", "eu-central", "eu-west"]
    central, west, south = found["eu-central"], found["eu-west"], found["ap-south"]
    assert [r.task_id for r in central.releases] == [5, 7] and west.releases == []
    assert regions.signal_line(central) == "Signal de: 300 gCO2/kWh, above its threshold of 250."
    assert regions.signal_line(west) == "Signal gb: 260 gCO2/kWh, above its threshold of 250."
    assert regions.signal_line(south) == "Signal in: no value yet."
    assert south.svg == "" and south.threshold is None
    assert regions.workers_line(west) == "2 worker(s) connected, 1 of 4 slot(s) busy."
    assert regions.workers_line(central).startswith("No worker connected")
    # The count is the scheduler's (3: one may be past the page read); the next is the soonest.
    assert regions.releases_line(central) == (
        "3 held task(s) planned to be released here: the next at 08:10:00 UTC (task 5, forecast 140)."
    )
    assert regions.releases_line(west) == "No held task is planned to be released here."
    assert regions.listed(central) == [(5, "08:10:00 UTC", "140"), (7, "08:20:00 UTC", "150")]
    # Each region's chart marks its own pool's releases only.
    assert re.findall(r'class="planned-release" data-task="(\d+)"', central.svg) == ["5", "7"]
    assert 'class="planned-release"' not in west.svg and 'class="threshold-line"' in west.svg


def test_a_value_at_its_threshold_is_at_or_under_it() -> None:
    region = regions.Region("p", "s", 250.0, "", 250.0, 0, 0, 0, 0)
    assert regions.signal_line(region) == "Signal s: 250, at or under its threshold of 250."


def test_the_next_release_is_the_schedulers_when_it_names_one() -> None:
    """The pending tasks read are one page: the scheduler's soonest release is the next one."""
    status = _status()
    central = status.pools[2]
    central.next_release_task_id = 3
    central.next_release_at.FromSeconds(int(NOW) + 60)
    central.next_release_intensity = 120.0
    pending = [_task(5, "eu-central", NOW + 600, 140.0)]
    found = {r.pool: r for r in regions.regions(status, pending, {}, now=NOW)}
    assert regions.releases_line(found["eu-central"]) == (
        "3 held task(s) planned to be released here: the next at 08:01:00 UTC (task 3, forecast 120)."
    )
