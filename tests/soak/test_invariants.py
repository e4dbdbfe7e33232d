"""The soak's invariants on crafted histories: each passes a clean one and fails the violation it
names (no I/O: they are pure functions of recorded facts)."""

from __future__ import annotations

from soak import invariants
from soak.facts import Ack, Execution, Fault, Sample, SignalPoint, TaskRow, Violation


def row(id_: int, state: str = "completed", attempt: int = 1, **more: object) -> TaskRow:
    fields: dict[str, object] = {
        "key": f"k{id_}",
        "tag": f"k{id_}",
        "activity_type": "plain",
        "worker_id": "worker-py-0",
        "started_at": 100.0,
    }
    fields.update(more)
    return TaskRow(id=id_, state=state, attempt=attempt, **fields)  # type: ignore[arg-type]


def names(found: list[Violation]) -> list[str]:
    return [v.invariant for v in found]


def test_an_acknowledged_submit_must_be_stored_once_under_its_key() -> None:
    rows = [row(1), row(2)]
    assert invariants.submits_exist_once([Ack("k1", 1, 0), Ack("k1", 1, 1), Ack("k2", 2, 0)], rows) == []
    assert names(invariants.submits_exist_once([Ack("k3", 3, 0)], rows)) == [invariants.SUBMITS]
    assert names(invariants.submits_exist_once([Ack("k1", 1, 0), Ack("k1", 2, 1)], rows)) == [invariants.SUBMITS] * 2
    refused = invariants.submits_exist_once([Ack("k1", 1, 0)], rows, [("k1", "INVALID_ARGUMENT: deadline: ...")])
    assert names(refused) == [invariants.SUBMITS]
    duplicated = [row(1), row(5, tag="k1", key=None)]
    found = invariants.submits_exist_once([Ack("k1", 1, 0)], duplicated)
    assert [v.subject for v in found] == ["submit k1"]


def test_a_running_task_needs_a_live_attempt_after_the_grace() -> None:
    running = row(7, state="running", attempt=2, started_at=100.0)
    live = Execution("worker-py-0", 11, 7, 2, start=101.0)
    assert invariants.stranded([running], [live], dead=set(), now=200.0, grace=60) == []
    # Young enough: not judged yet.
    assert invariants.stranded([running], [], dead=set(), now=150.0, grace=60) == []
    never_begun = invariants.stranded([running], [], dead=set(), now=200.0, grace=60)
    assert names(never_begun) == [invariants.TASKS_END]
    assert "no worker ever began it" in never_begun[0].detail
    assert names(invariants.stranded([running], [live], dead={11}, now=200.0, grace=60)) == [invariants.TASKS_END]
    ended = Execution("worker-py-0", 11, 7, 2, start=101.0, end=102.0, ok=True)
    assert names(invariants.stranded([running], [ended], dead=set(), now=200.0, grace=60)) == [invariants.TASKS_END]
    # An earlier attempt's run is not this attempt's.
    earlier = Execution("worker-py-0", 11, 7, 1, start=90.0)
    assert names(invariants.stranded([running], [earlier], dead=set(), now=200.0, grace=60)) == [invariants.TASKS_END]


def test_every_task_ends() -> None:
    assert invariants.tasks_end([row(1), row(2, state="skipped"), row(3, state="shed")]) == []
    assert names(invariants.tasks_end([row(1), row(2, state="pending", attempt=0)])) == [invariants.TASKS_END]


def test_an_attempt_never_runs_in_two_places_at_once() -> None:
    first = Execution("worker-py-0", 11, 7, 1, start=100.0, end=105.0, ok=True)
    after = Execution("worker-node-2", 12, 7, 1, start=106.0, end=107.0, ok=True)
    assert invariants.one_runner_per_attempt([first, after], {}, run_end=500.0) == []
    overlapping = Execution("worker-node-2", 12, 7, 1, start=103.0, end=104.0, ok=True)
    assert names(invariants.one_runner_per_attempt([first, overlapping], {}, 500.0)) == [invariants.ONE_RUNNER]
    # An attempt never ended ran until its process was killed: one begun after that is fine.
    unended = Execution("worker-py-0", 11, 8, 1, start=100.0)
    later = Execution("worker-py-1", 13, 8, 1, start=120.0, end=121.0, ok=True)
    assert invariants.one_runner_per_attempt([unended, later], {11: 110.0}, 500.0) == []
    assert names(invariants.one_runner_per_attempt([unended, later], {}, 500.0)) == [invariants.ONE_RUNNER]


def test_a_task_runs_again_only_after_a_failure_or_a_loss() -> None:
    retried = row(7, attempt=2)
    failed = Execution("worker-py-0", 11, 7, 1, start=100.0, end=101.0, ok=False)
    lost = Execution("worker-py-0", 11, 7, 1, start=100.0)
    completed = Execution("worker-py-0", 11, 7, 1, start=100.0, end=101.0, ok=True)
    for earlier in (failed, lost):
        assert invariants.retries_justified([retried], [earlier], [], lease=10, slack=5) == []
    for_nothing = invariants.retries_justified([retried], [completed], [], lease=10, slack=5)
    assert names(for_nothing) == [invariants.RETRIES]
    # A fault that could have lost the report justifies it; one far off or elsewhere does not.
    for target in ("worker-py-0", "workers", "scheduler-1", "postgres"):
        near = [Fault("kill", target, at=108.0, until=112.0)]
        assert invariants.retries_justified([retried], [completed], near, lease=10, slack=5) == []
    unrelated = [Fault("kill", "worker-py-1", 105.0, 106.0), Fault("kill", "signal", 105.0, 106.0)]
    far = [Fault("kill", "scheduler-1", 300.0, 305.0)]
    for faults in (unrelated, far):
        assert names(invariants.retries_justified([retried], [completed], faults, lease=10, slack=5)) == [
            invariants.RETRIES
        ]


def test_a_deferrable_task_is_not_dispatched_while_its_signal_is_high() -> None:
    history = [SignalPoint(90.0, 150.0), SignalPoint(95.0, 300.0), SignalPoint(99.5, 150.0), SignalPoint(120.0, 300.0)]
    check = {"deferrable": {"defer"}, "threshold": 215.0, "lag": 2.0}
    low = row(1, activity_type="defer", started_at=100.0, signal_at_dispatch=150.0)
    assert invariants.holds_respected([low], history, **check) == []  # type: ignore[arg-type]
    recorded_high = row(2, activity_type="defer", started_at=100.0, signal_at_dispatch=300.0)
    assert names(invariants.holds_respected([recorded_high], history, **check)) == [invariants.HOLDS]  # type: ignore[arg-type]
    # The scheduler said low, but the history had been high for the whole lag before it.
    stale = row(3, activity_type="defer", started_at=125.0, signal_at_dispatch=150.0)
    assert names(invariants.holds_respected([stale], history, **check)) == [invariants.HOLDS]  # type: ignore[arg-type]
    # Within the lag of the change, released by max_defer, or not deferrable: not judged high.
    just_after = row(4, activity_type="defer", started_at=121.0, signal_at_dispatch=150.0)
    by_max_defer = row(5, activity_type="defer", started_at=125.0, signal_at_dispatch=300.0, released_by="max_defer")
    plain = row(6, started_at=125.0, signal_at_dispatch=300.0)
    assert invariants.holds_respected([just_after, by_max_defer, plain], history, **check) == []  # type: ignore[arg-type]


def test_a_fixed_start_hits_or_is_missed_for_a_true_reason() -> None:
    hit = row(1, activity_type="fixed", start_at=100.0, start_tolerance=2.0, start_hit=True)
    assert invariants.fixed_starts_honest([hit], [], slack=10) == []
    late = row(2, activity_type="fixed", start_at=100.0, start_tolerance=2.0, start_hit=False)
    assert names(invariants.fixed_starts_honest([late], [], slack=10)) == [invariants.FIXED]
    down = "the scheduler was not running at the start time (down from x to y)"
    missed = row(3, state="skipped", attempt=0, start_at=100.0, start_tolerance=2.0, missed=True, miss_reason=down)
    assert names(invariants.fixed_starts_honest([missed], [], slack=10)) == [invariants.FIXED]
    assert invariants.fixed_starts_honest([missed], [Fault("kill", "scheduler-2", 95.0, 99.0)], slack=10) == []
    # A worker's fault does not make "the scheduler was not running" true.
    assert names(invariants.fixed_starts_honest([missed], [Fault("kill", "worker-fixed-py", 95.0, 99.0)], slack=10))
    no_worker = row(4, state="skipped", attempt=0, start_at=100.0, missed=True, miss_reason="no worker of pool fixed")
    assert invariants.fixed_starts_honest([no_worker], [Fault("kill", "worker-fixed-py", 95.0, 99.0)], slack=10) == []
    no_reason = row(5, state="skipped", attempt=0, start_at=100.0, missed=True, miss_reason="")
    assert names(invariants.fixed_starts_honest([no_reason], [], slack=10)) == [invariants.FIXED]


def test_services_stay_bounded() -> None:
    steady = [Sample("scheduler-1", 5, float(t), 100 << 20, 50) for t in range(0, 300, 10)]
    assert invariants.resources_bounded(steady, rss_limit=1 << 30, fd_limit=1000) == []
    leaking = [Sample("scheduler-1", 5, float(t), (100 + 4 * t) << 20, 50 + t) for t in range(0, 300, 10)]
    assert names(invariants.resources_bounded(leaking, rss_limit=4 << 30, fd_limit=1000)) == [invariants.BOUNDED] * 2
    huge = [Sample("signal", 6, 0.0, 2 << 30, 2000)]
    assert names(invariants.resources_bounded(huge, rss_limit=1 << 30, fd_limit=1000)) == [invariants.BOUNDED] * 2
