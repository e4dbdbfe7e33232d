"""Where and when (domain.placement): the pool and the start of a task that may run in several."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from scheduler_service.domain import pool_auction
from scheduler_service.domain.placement import PlaceTask, Region, beside_placed, place, placed_runs
from scheduler_service.domain.planning import Capacity, Commitment, Forecast, PlanTask, plan

NOW = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def hourly(*values: float) -> Forecast:
    return Forecast.of([(NOW + i * HOUR, v) for i, v in enumerate(values)])


def task(task_id: int, slack_h: int = 6, *, regions: tuple[str, ...] = ()) -> PlaceTask:
    return PlaceTask(PlanTask(task_id, NOW, NOW + slack_h * HOUR, HOUR), regions)


@pytest.fixture(autouse=True, params=["one auction", "two rounds"])
def placement_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every placement is checked both ways it is made: by one auction, and by the two rounds a
    placement too large for one auction (pool_auction.AUCTION_WORK starts) falls back to."""
    if request.param == "two rounds":
        monkeypatch.setattr(pool_auction, "AUCTION_WORK", 0)
    return str(request.param)


WEST = hourly(260, 250, 240, 230, 220, 210, 200, 200)
CENTRAL = hourly(300, 290, 280, 180, 290, 300, 300, 300)


def test_a_task_allowed_in_two_pools_runs_where_and_when_the_forecast_is_lowest() -> None:
    regions = [Region("eu-west", WEST, Capacity(2), unit="gCO2/kWh"), Region("eu-central", CENTRAL, Capacity(2))]
    (got,) = place([task(1)], regions, NOW, resolution=HOUR)
    assert (got.region, got.plan.release_at) == ("eu-central", NOW + 3 * HOUR)
    assert got.reason.startswith("eu-central at 03:00: 180 against 260 in eu-west now")
    assert got.options == {"eu-west": 200.0, "eu-central": 180.0}


def test_a_release_on_another_day_is_said_with_its_date() -> None:
    # Planned at 22:00 for 03:00 the next day: "at 03:00" would read as a time today.
    late = NOW - 2 * HOUR
    west = Forecast.of([(late + i * HOUR, 260.0) for i in range(10)])
    central = Forecast.of([(late + i * HOUR, 180.0 if i == 5 else 300.0) for i in range(10)])
    regions = [Region("eu-west", west, Capacity(2)), Region("eu-central", central, Capacity(2))]
    (got,) = place([PlaceTask(PlanTask(1, late, NOW + 6 * HOUR, HOUR), ())], regions, late, resolution=HOUR)
    assert got.reason.startswith("eu-central at 2026-03-01 03:00: 180 against 260 in eu-west now"), got.reason


def test_a_task_naming_one_pool_stays_in_it() -> None:
    regions = [Region("eu-west", WEST, Capacity(2)), Region("eu-central", CENTRAL, Capacity(2))]
    (got,) = place([task(1, regions=("eu-west",))], regions, NOW, resolution=HOUR)
    assert got.region == "eu-west"
    assert got.plan.release_at == NOW + 6 * HOUR
    assert list(got.options) == ["eu-west"]


def test_a_cheap_hour_is_left_to_the_work_expected_there_when_a_task_loses_less_elsewhere() -> None:
    # One slot in each pool. Central's 03:00 is the cheapest start for the pending task (50; 150 at
    # 06:00 there, 120 at 01:00 in west), and the only cheap one for the task expected at 02:00
    # with 2 hours of slack (300 anywhere else): moving costs the pending task less.
    west = hourly(300, 120, 300, 300, 300, 300, 300, 300)
    central = hourly(300, 300, 300, 50, 300, 300, 150, 300)
    regions = [Region("eu-west", west, Capacity(1)), Region("eu-central", central, Capacity(1))]
    coming = PlaceTask(PlanTask(-1, NOW + 2 * HOUR, NOW + 4 * HOUR, HOUR))
    (alone,) = place([task(1)], regions, NOW, resolution=HOUR)
    assert (alone.region, alone.plan.release_at) == ("eu-central", NOW + 3 * HOUR)
    (beside,) = place([task(1)], regions, NOW, resolution=HOUR, expected=[coming])
    assert (beside.region, beside.plan.release_at) == ("eu-west", NOW + HOUR)
    # With room for both in central, nothing moves.
    roomy = [Region("eu-west", west, Capacity(1)), Region("eu-central", central, Capacity(2))]
    (both,) = place([task(1)], roomy, NOW, resolution=HOUR, expected=[coming])
    assert (both.region, both.plan.release_at) == ("eu-central", NOW + 3 * HOUR)


def test_the_cleanest_pool_full_sends_the_task_that_loses_least_to_the_other_place() -> None:
    regions = [Region("eu-west", WEST, Capacity(1)), Region("eu-central", CENTRAL, Capacity(1))]
    placed = place([task(1), task(2)], regions, NOW, resolution=HOUR)
    # One runs at eu-central's 180; the other would get 280 or worse there, and 200 in eu-west.
    assert sorted((p.region, p.plan.release_at) for p in placed) == [
        ("eu-central", NOW + 3 * HOUR),
        ("eu-west", NOW + 6 * HOUR),
    ]


def test_a_pool_without_workers_is_planned_around() -> None:
    regions = [Region("eu-west", WEST, Capacity(2)), Region("eu-central", CENTRAL, Capacity(0))]
    (got,) = place([task(1)], regions, NOW, resolution=HOUR)
    assert got.region == "eu-west"
    assert "eu-central has no workers" in got.reason
    # With no allowed pool open, the task is held for the one it names, still by its latest start.
    (alone,) = place([task(2, regions=("eu-central",))], regions, NOW, resolution=HOUR)
    assert alone.region == "eu-central"
    assert alone.plan.release_at <= NOW + 6 * HOUR


def test_a_re_plan_keeps_the_last_place_on_a_tie() -> None:
    flat = hourly(200, 200, 200, 200, 200, 200, 200, 200)
    regions = [Region("a", flat, Capacity(2)), Region("b", flat, Capacity(2))]
    first = PlaceTask(PlanTask(1, NOW, NOW + 6 * HOUR, HOUR), (), "b")
    (got,) = place([first], regions, NOW, resolution=HOUR)
    assert got.region == "b"


def test_no_start_is_planned_past_the_latest_start_in_any_pool() -> None:
    regions = [Region("eu-west", WEST, Capacity(1)), Region("eu-central", CENTRAL, Capacity(1))]
    placed = place([task(i, slack_h=3) for i in range(6)], regions, NOW, resolution=HOUR)
    assert all(p.plan.release_at <= NOW + 3 * HOUR for p in placed)


def test_an_unknown_pool_is_refused_by_name() -> None:
    regions = [Region("eu-west", WEST, Capacity(1))]
    with pytest.raises(ValueError, match="no such pool 'mars'"):
        place([task(1, regions=("mars",))], regions, NOW, resolution=HOUR)


def _plain(task_id: int, capacity: Capacity) -> datetime:
    """When work naming no pool, following eu-west's grid, is planned to start in this room."""
    work = [PlanTask(task_id, NOW, NOW + 6 * HOUR, HOUR)]
    (got,) = plan(work, WEST, capacity, NOW, signal_low=False, resolution=HOUR)
    return got.release_at


def test_work_naming_no_pool_is_not_promised_the_slot_a_placed_task_has() -> None:
    """eu-west's one slot at its cleanest hour goes to the task placed there; the work naming no
    pool, on the same grid, takes the next cleanest hour rather than the same slot."""
    placing = [task(1, regions=("eu-west",))]
    placements = place(placing, [Region("eu-west", WEST, Capacity(1))], NOW, resolution=HOUR)
    assert placements[0].plan.release_at == NOW + 6 * HOUR
    runs = placed_runs(placing, placements)
    assert runs == {"eu-west": (Commitment(NOW + 6 * HOUR, NOW + 7 * HOUR),)}
    assert _plain(2, beside_placed({"eu-west": 1}, runs)) == NOW + 5 * HOUR


def test_work_naming_no_pool_keeps_the_clean_hour_where_another_pool_has_room() -> None:
    placing = [task(1, regions=("eu-west",))]
    runs = placed_runs(placing, place(placing, [Region("eu-west", WEST, Capacity(1))], NOW, resolution=HOUR))
    assert _plain(2, beside_placed({"eu-west": 1, "eu-central": 1}, runs)) == NOW + 6 * HOUR
    # A pool whose workers do not run the work gives it no room, and its placed runs take none.
    assert _plain(3, beside_placed({"eu-central": 1}, runs)) == NOW + 6 * HOUR


def test_fixed_starts_and_placed_runs_are_both_left_out_of_the_shared_room() -> None:
    placing = [task(1, regions=("eu-west",))]
    runs = placed_runs(placing, place(placing, [Region("eu-west", WEST, Capacity(2))], NOW, resolution=HOUR))
    # eu-west's two slots: one placed at 06:00, one booked by a fixed start from 05:00 to 08:00.
    fixed = Commitment(NOW + 5 * HOUR, NOW + 8 * HOUR)
    room = beside_placed({"eu-west": 2}, runs, [fixed])
    assert room == Capacity(2, (fixed, *runs["eu-west"]))
    # Either alone would leave a slot at 06:00.
    assert _plain(2, room) == NOW + 5 * HOUR


def test_a_task_the_threshold_hold_releases_takes_no_room_in_the_plan() -> None:
    placing = [task(1, regions=("eu-west",))]
    placements = place(placing, [Region("eu-west", None, Capacity(1))], NOW, resolution=HOUR)
    assert placed_runs(placing, placements) == {}


def test_expected_work_never_costs_a_pending_task_its_room_in_another_pool() -> None:
    # The same pools as above, but eu-west's one slot is taken for 7 hours by a pending
    # task that has no choice (it names eu-west only, latest start now). Alone, task 1 runs in
    # central at 03:00 with room. Beside the task expected in central, it loses 03:00 there (to
    # 06:00, 150), and round two moves it to west on west's roomy best (120 at 01:00): but west
    # has no room, so the pending task ends without room because of work that may never come.
    west = hourly(300, 120, 300, 300, 300, 300, 300, 300, 300, 300)
    central = hourly(300, 300, 300, 50, 300, 300, 150, 300, 300, 300)
    regions = [Region("eu-west", west, Capacity(1)), Region("eu-central", central, Capacity(1))]
    busy = PlaceTask(PlanTask(2, NOW, NOW, 7 * HOUR), ("eu-west",))
    coming = PlaceTask(PlanTask(-1, NOW + 2 * HOUR, NOW + 4 * HOUR, HOUR))
    alone = place([task(1), busy], regions, NOW, resolution=HOUR)
    assert not any(p.plan.over_capacity for p in alone)
    beside = place([task(1), busy], regions, NOW, resolution=HOUR, expected=[coming])
    assert not any(p.plan.over_capacity for p in beside), [(p.region, p.plan) for p in beside]


# The two rounds send two of the three to eu-west's one clean hour (the reason for the auction).
@pytest.mark.parametrize("placement_way", ["one auction"], indirect=True)
def test_tasks_that_overflow_the_cleanest_pool_share_the_other_by_what_each_loses() -> None:
    """One slot in each pool, three tasks that all start best in eu-central at 03:00 (100). The
    best the three can have is 03:00 and 05:00 in eu-central (100, 150) and 01:00 in eu-west
    (120): eu-west's one clean hour goes to one task only, the other runs at eu-central's next."""
    west = hourly(300, 120, 300, 300, 290, 300, 300, 300)
    central = hourly(300, 300, 300, 100, 300, 150, 300, 300)
    regions = [Region("eu-west", west, Capacity(1)), Region("eu-central", central, Capacity(1))]
    placed = place([task(1), task(2), task(3)], regions, NOW, resolution=HOUR)
    assert sorted((p.region, p.plan.release_at) for p in placed) == [
        ("eu-central", NOW + 3 * HOUR),
        ("eu-central", NOW + 5 * HOUR),
        ("eu-west", NOW + HOUR),
    ]


def test_a_placement_past_its_bound_places_every_task_in_its_window_and_the_urgent_ones_as_alone() -> None:
    """Twelve tasks in two pools of one slot, a bound of four: the four most urgent (the one with
    no choice of start, then the earliest latest starts) are placed as they would be without the
    others, and every task gets a start in its window, in a pool it may run in, with no slot
    promised twice while there is room."""
    west = hourly(260, 250, 240, 230, 220, 210, 200, 200, 210, 220, 230, 240, 250, 260, 270, 280)
    central = hourly(300, 290, 280, 180, 290, 300, 300, 300, 150, 160, 300, 300, 300, 300, 300, 300)
    regions = [Region("eu-west", west, Capacity(1)), Region("eu-central", central, Capacity(1))]
    due_now = PlaceTask(PlanTask(99, NOW - HOUR, NOW, HOUR), ("eu-west",))
    backlog = [task(i, slack_h=2 + i) for i in range(1, 12)]
    given = [*reversed(backlog), due_now]
    placed = {p.task_id: p for p in place(given, regions, NOW, resolution=HOUR, exact=4)}
    assert set(placed) == {t.task.task_id for t in given}
    for t in given:
        p = placed[t.task.task_id]
        assert max(t.task.earliest, NOW) <= p.plan.release_at <= t.task.latest_start
        assert p.region in (t.regions or ("eu-west", "eu-central"))
        assert not p.plan.over_capacity
    # The most urgent, placed as alone: the backlog past the bound costs them nothing.
    urgent = [due_now, *backlog[:3]]
    alone = place(urgent, regions, NOW, resolution=HOUR)
    assert [(placed[p.task_id].region, placed[p.task_id].plan) for p in alone] == [(p.region, p.plan) for p in alone]
    assert placed[99].plan.release_at == NOW
    # One slot a pool: no two runs in the same pool overlap.
    runs = placed_runs(given, [placed[t.task.task_id] for t in given])
    for pool, taken in runs.items():
        starts = sorted(r.start for r in taken)
        assert all(b - a >= HOUR for a, b in itertools.pairwise(starts)), pool


def test_a_placement_within_its_bound_is_the_exact_one_and_no_task_without_a_choice_is_past_it() -> None:
    regions = [Region("eu-west", WEST, Capacity(1)), Region("eu-central", CENTRAL, Capacity(1))]
    given = [task(i, slack_h=3 + i % 3) for i in range(6)]
    assert place(given, regions, NOW, resolution=HOUR, exact=6) == place(given, regions, NOW, resolution=HOUR)
    # Three tasks due now and a bound of one: all three still start now, where they must.
    due = [PlaceTask(PlanTask(i, NOW - HOUR, NOW, HOUR), ("eu-west",)) for i in (7, 8, 9)]
    placed = place([*given, *due], regions, NOW, resolution=HOUR, exact=1)
    assert [(p.region, p.plan.release_at) for p in placed[-3:]] == [("eu-west", NOW)] * 3
    assert all(NOW <= p.plan.release_at <= t.task.latest_start for p, t in zip(placed, given, strict=False))


def test_a_task_naming_pools_is_planned_with_the_caution_of_its_window_as_one_naming_none() -> None:
    # eu-west: now 100 (known), later 95, each point off by 10 %: at caution 1 not surely under
    # 100, at caution 0 it is; eu-central dearer all along. A caution falling with the window
    # waits in a day's window, not in 4 hours' (as planning.plan plans a task naming no pool).
    start = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)
    half = timedelta(minutes=30)
    west = Forecast.of([(start, 100.0, 0.0), *((start + i * half, 95.0, 0.1) for i in range(1, 60))])
    central = Forecast.of([(start + i * half, 140.0) for i in range(60)])

    def by_window(window: timedelta) -> float:
        return 1.0 if window <= 4 * HOUR else 0.0

    short, long = (PlaceTask(PlanTask(n, start, start + h * HOUR, half)) for n, h in ((1, 4), (2, 24)))
    for slots in (2, 1):  # room for both, and a pool the two share
        regions = [
            Region("eu-west", west, Capacity(slots), caution=by_window),
            Region("eu-central", central, Capacity(slots), caution=by_window),
        ]
        got = place([short, long], regions, start, resolution=half)
        assert [(p.region, p.plan.release_at) for p in got] == [("eu-west", start), ("eu-west", start + half)]
        alone = plan([short.task, long.task], west, Capacity(slots), start, signal_low=False, caution=by_window)
        assert [p.plan.release_at for p in got] == [p.release_at for p in alone]
