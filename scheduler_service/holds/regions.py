"""Where and when for held tasks that name pools: each pool planned on its own grid's signal
(`[pools.NAME] signal`, else the signal the task's type follows) with the room its connected
workers have, and the task placed by scheduler_service.domain.placement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from lowtide.config import Config
from scheduler_service.domain.placement import Placement, PlaceTask, Region, place, placed_runs
from scheduler_service.domain.planning import Capacity, Commitment, PlanKind, PlanTask
from scheduler_service.holds.signals import HoldsSnapshot

# The capacity planning's time step, as planning.plan's default.
RESOLUTION = timedelta(minutes=5)
MIN_RESOLUTION = timedelta(seconds=1)


def pool_signal(config: Config, holds: HoldsSnapshot, pool: str, queue: str, activity_type: str) -> str:
    """The signal a pool is planned on: its own (`[pools.NAME] signal`), else the one the task's
    type follows (as a task naming no pools is planned)."""
    own = config.pool(pool).signal
    if own and own in holds.by_signal:
        return own
    return holds.config.signal_for(queue, activity_type, holds.default)


def regions(
    config: Config,
    holds: HoldsSnapshot,
    names: Sequence[str],
    slots: Mapping[str, int],
    *,
    queue: str,
    activity_type: str,
    committed: Mapping[str, Sequence[Commitment]] | None = None,
) -> list[Region]:
    """The pools `names` as the placement sees them: forecast, room (the slots of their connected
    workers; none: the pool is planned around) and what each one's threshold hold says now."""
    out = []
    for name in names:
        hold = holds.by_signal[pool_signal(config, holds, name, queue, activity_type)]
        out.append(
            Region(
                name,
                hold.forecast,
                # Fixed starts were promised their pool's capacity: a placement leaves it to them.
                Capacity(max(0, slots.get(name, 0)), tuple((committed or {}).get(name, ()))),
                signal_low=hold.signal_low,
                # The caution its signal's calibration found to pay (the default without one), by
                # a task's window where it found that to pay, as for a task naming no pool.
                caution=hold.planning_caution,
                unit=hold.unit,
            )
        )
    return out


def placed(
    config: Config,
    holds: HoldsSnapshot,
    tasks: Sequence[tuple[PlanTask, tuple[str, ...], str | None, str, str]],
    slots: Mapping[str, int],
    now: datetime,
    *,
    committed: Mapping[str, Sequence[Commitment]] | None = None,
    expected: Mapping[str, Sequence[PlanTask]] | None = None,
) -> list[Placement]:
    """One placement per task ((its plan task, the pools it names, the pool its last plan chose,
    its queue, its type)), in the order given. A pool with no signal of its own is planned on the
    signal the task's type follows: the tasks are placed in groups by that signal, each group in
    the room the groups before it left (their placed runs count as commitments), beside the work
    `expected` later of the types that follow that signal (by signal name; it may run in any pool
    the group names)."""
    groups: dict[str, list[int]] = {}
    for i, (_, _, _, queue, activity_type) in enumerate(tasks):
        groups.setdefault(holds.config.signal_for(queue, activity_type, holds.default), []).append(i)
    taken = {pool: list(runs) for pool, runs in (committed or {}).items()}
    out: dict[int, Placement] = {}
    for signal, indexes in sorted(groups.items()):
        group = [tasks[i] for i in indexes]
        names = sorted({name for _, pools, _, _, _ in group for name in pools})
        _, _, _, queue, activity_type = group[0]
        places = regions(config, holds, names, slots, queue=queue, activity_type=activity_type, committed=taken)
        given = [PlaceTask(task, pools, last) for task, pools, last, _, _ in group]
        # The room is counted in steps no longer than the shortest task (at most RESOLUTION): a
        # step longer than a task counts it busy for the whole step.
        step = max(MIN_RESOLUTION, min(RESOLUTION, *(task.duration for task, *_ in group)))
        coming = [PlaceTask(task) for task in (expected or {}).get(signal, ())]
        placements = place(given, places, now, resolution=step, expected=coming)
        for pool, runs in placed_runs(given, placements).items():
            taken.setdefault(pool, []).extend(runs)
        out.update(zip(indexes, placements, strict=True))
    return [out[i] for i in range(len(tasks))]


def chosen_pool(placement: Placement) -> str | None:
    """The pool a placement holds its task for: None when no forecast placed it (the threshold
    hold decides when, and any pool it names may take it)."""
    return None if placement.plan.kind is PlanKind.THRESHOLD else placement.region
