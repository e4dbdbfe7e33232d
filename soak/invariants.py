"""The promises a soak checks, each a pure function of recorded facts (soak.facts) returning its
violations: no I/O, no clock, so each is tried on a crafted history in the unit tests."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence

from soak.facts import TERMINAL, Ack, Execution, Fault, Sample, SignalPoint, TaskRow, Violation

SUBMITS = "submits_exist_once"
TASKS_END = "tasks_end"
ONE_RUNNER = "one_runner_per_attempt"
RETRIES = "retries_justified"
HOLDS = "holds_respected"
FIXED = "fixed_starts_honest"
BOUNDED = "resources_bounded"
INVARIANTS = (SUBMITS, TASKS_END, ONE_RUNNER, RETRIES, HOLDS, FIXED, BOUNDED)


def submits_exist_once(
    acks: Iterable[Ack], rows: Iterable[TaskRow], refused_resubmits: Iterable[tuple[str, str]] = ()
) -> list[Violation]:
    """Every acknowledged submit is stored, under its key, and once: a key never answers two
    task ids, no two rows carry the same submit (the tag in the payload), and a re-submit of an
    acknowledged key (key, status) is answered with its task, never refused."""
    by_id = {row.id: row for row in rows}
    found = [
        Violation(SUBMITS, f"key {key}", f"re-submitted after it was acknowledged, refused with {status}")
        for key, status in refused_resubmits
    ]
    ids_of_key: dict[str, set[int]] = defaultdict(set)
    for ack in acks:
        ids_of_key[ack.key].add(ack.task_id)
        row = by_id.get(ack.task_id)
        if row is None:
            found.append(Violation(SUBMITS, f"task {ack.task_id}", f"acknowledged for key {ack.key} but not stored"))
        elif row.key != ack.key:
            found.append(
                Violation(SUBMITS, f"task {ack.task_id}", f"acknowledged for key {ack.key}, stored as {row.key}")
            )
    for key, ids in ids_of_key.items():
        if len(ids) > 1:
            found.append(Violation(SUBMITS, f"key {key}", f"acknowledged as {len(ids)} tasks: {sorted(ids)}"))
    rows_of_tag: dict[str, list[int]] = defaultdict(list)
    for row in by_id.values():
        if row.tag:
            rows_of_tag[row.tag].append(row.id)
    for tag, stored in rows_of_tag.items():
        if len(stored) > 1:
            found.append(Violation(SUBMITS, f"submit {tag}", f"stored {len(stored)} times: tasks {sorted(stored)}"))
    return found


def _executions_by_attempt(executions: Iterable[Execution]) -> dict[tuple[int, int], list[Execution]]:
    by_attempt: dict[tuple[int, int], list[Execution]] = defaultdict(list)
    for execution in executions:
        by_attempt[(execution.task_id, execution.attempt)].append(execution)
    return by_attempt


def stranded(
    rows: Iterable[TaskRow], executions: Iterable[Execution], dead: Collection[int], now: float, grace: float
) -> list[Violation]:
    """During the run: a task running for longer than `grace` must have a live attempt, one its
    worker began and has not ended, in a process not killed (`dead` pids). A claim no worker ever
    began, or an attempt whose worker died or reported it, left running, is stranded."""
    by_attempt = _executions_by_attempt(executions)
    found = []
    for row in rows:
        if row.state != "running" or row.started_at is None or now - row.started_at <= grace:
            continue
        runs = by_attempt.get((row.id, row.attempt), [])
        if any(e.end is None and e.pid not in dead for e in runs):
            continue
        why = "no worker ever began it" if not runs else "its attempt ended or its worker died"
        subject = f"task {row.id} attempt {row.attempt}"
        found.append(
            Violation(TASKS_END, subject, f"running for {now - row.started_at:.0f} s on {row.worker_id}: {why}")
        )
    return found


def tasks_end(rows: Iterable[TaskRow]) -> list[Violation]:
    """At the end, once the load stopped and every service is back: every task has ended."""
    return [
        Violation(TASKS_END, f"task {row.id}", f"left {row.state} at attempt {row.attempt} ({row.activity_type})")
        for row in rows
        if row.state not in TERMINAL
    ]


def one_runner_per_attempt(
    executions: Iterable[Execution], deaths: Mapping[int, float], run_end: float
) -> list[Violation]:
    """No attempt (task, attempt number) runs in two places at once: two workers, or twice in one.
    An attempt not ended ran until its process was killed (`deaths`, pid to time) or the run ended."""
    found = []
    for (task_id, attempt), runs in _executions_by_attempt(executions).items():
        if len(runs) < 2:
            continue
        spans = sorted((e.start, e.end if e.end is not None else deaths.get(e.pid, run_end), e) for e in runs)
        for (start_a, end_a, a), (start_b, _end_b, b) in itertools.pairwise(spans):
            if start_b < end_a:
                found.append(
                    Violation(
                        ONE_RUNNER,
                        f"task {task_id} attempt {attempt}",
                        f"ran on {a.worker} (pid {a.pid}) from {start_a:.3f} and on {b.worker} (pid {b.pid}) "
                        f"from {start_b:.3f}, before the first ended at {end_a:.3f}",
                    )
                )
    return found


def _touches(fault: Fault, worker: str) -> bool:
    """Whether a fault could lose what `worker` reported: its own process, its connection, the
    scheduler replicas or the database. The signal service carries no results."""
    return fault.target in (worker, "workers", "postgres") or fault.target.startswith("scheduler")


def retries_justified(
    rows: Iterable[TaskRow], executions: Iterable[Execution], faults: Sequence[Fault], *, lease: float, slack: float
) -> list[Violation]:
    """A task ran again only because an earlier attempt failed or was lost: an attempt its worker
    completed, with no fault that could have lost its report from its start to a lease after it
    ended, makes the next attempt a duplicate for nothing."""
    by_attempt = _executions_by_attempt(executions)
    found = []
    for row in rows:
        for attempt in range(1, row.attempt):
            for run in by_attempt.get((row.id, attempt), []):
                if not run.ok or run.end is None:
                    continue
                window = (run.start - slack, run.end + lease + slack)
                if any(_touches(f, run.worker) and f.at <= window[1] and f.until >= window[0] for f in faults):
                    continue
                found.append(
                    Violation(
                        RETRIES,
                        f"task {row.id} attempt {attempt}",
                        f"completed on {run.worker} at {run.end:.3f} with no fault near it, "
                        f"yet the task ran again (attempt {row.attempt})",
                    )
                )
    return found


def holds_respected(
    rows: Iterable[TaskRow],
    history: Sequence[SignalPoint],
    *,
    deferrable: Collection[str],
    threshold: float,
    lag: float,
) -> list[Violation]:
    """A cost-deferrable task is dispatched while the hold is on only when its max_defer (or its
    planned latest start) runs out: otherwise the signal the scheduler recorded at dispatch is
    not above the threshold, and the signal's history shows it not above for the whole `lag`
    before (the time a new value takes to reach the scheduler) either."""
    points = sorted(history, key=lambda p: p.at)
    times = [p.at for p in points]
    found = []
    for row in rows:
        if row.activity_type not in deferrable or row.started_at is None or row.attempt < 1:
            continue
        if row.released_by == "max_defer":
            continue
        subject = f"task {row.id} attempt {row.attempt}"
        if row.signal_at_dispatch is None or row.signal_at_dispatch > threshold:
            found.append(
                Violation(
                    HOLDS, subject, f"dispatched with the signal at {row.signal_at_dispatch} (threshold {threshold:g})"
                )
            )
            continue
        first = bisect.bisect_right(times, row.started_at - lag) - 1
        if first < 0:
            continue  # no history that far back: nothing to judge by
        last = bisect.bisect_right(times, row.started_at)
        values = [p.value for p in points[first:last]]
        if all(v > threshold for v in values):
            found.append(
                Violation(
                    HOLDS,
                    subject,
                    f"dispatched at {row.started_at:.3f} while the signal had been above {threshold:g} for "
                    f"{lag:g} s and more ({min(values):g} to {max(values):g})",
                )
            )
    return found


def _reason_faults(reason: str) -> tuple[str, ...]:
    """The fault targets that make a miss reason true: the scheduler down needs a replica or the
    database gone; no worker needs a worker of the pool, their connections, or the services gone;
    anything else (no free slot, not dispatched) any fault but the signal service's."""
    if reason.startswith("the scheduler was not running"):
        return ("scheduler", "postgres")
    if reason.startswith("no worker"):
        return ("worker-fixed", "workers", "scheduler", "postgres")
    return ("worker", "workers", "scheduler", "postgres")


def fixed_starts_honest(rows: Iterable[TaskRow], faults: Sequence[Fault], *, slack: float) -> list[Violation]:
    """A fixed start started within its tolerance, or was marked missed with a reason that the
    faults around its start time make true; never started late without being marked missed."""
    found = []
    for row in rows:
        if row.start_at is None:
            continue
        subject = f"task {row.id} (start {row.start_at:.3f})"
        tolerance = row.start_tolerance or 0.0
        if not row.missed:
            if row.attempt >= 1 and row.start_hit is False:
                found.append(Violation(FIXED, subject, "started outside its tolerance but not marked missed"))
            continue
        reason = row.miss_reason or ""
        if not reason:
            found.append(Violation(FIXED, subject, "marked missed with no reason"))
            continue
        window = (row.start_at - tolerance - slack, row.start_at + tolerance + slack)
        targets = _reason_faults(reason)
        if not any(f.target.startswith(targets) and f.at <= window[1] and f.until >= window[0] for f in faults):
            found.append(Violation(FIXED, subject, f"missed ({reason}) with no fault near its start that makes it so"))
    return found


def resources_bounded(
    samples: Iterable[Sample], *, rss_limit: int, fd_limit: int, min_span: float = 120.0
) -> list[Violation]:
    """Each service process stays under `rss_limit` bytes and `fd_limit` descriptors, and one that
    lived `min_span` seconds or more does not grow without bound: its second half's peak stays
    under 1.5 times its first half's (plus 64 MiB; plus 100 descriptors)."""
    series: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for sample in samples:
        series[(sample.process, sample.pid)].append(sample)
    found = []
    for (process, pid), points in series.items():
        points.sort(key=lambda s: s.at)
        subject = f"{process} (pid {pid})"
        peak_rss, peak_fds = max(s.rss for s in points), max(s.fds for s in points)
        if peak_rss > rss_limit:
            found.append(
                Violation(BOUNDED, subject, f"resident memory {peak_rss >> 20} MiB over {rss_limit >> 20} MiB")
            )
        if peak_fds > fd_limit:
            found.append(Violation(BOUNDED, subject, f"{peak_fds} file descriptors over {fd_limit}"))
        if points[-1].at - points[0].at < min_span:
            continue
        middle = points[0].at + (points[-1].at - points[0].at) / 2
        first = [s for s in points if s.at <= middle]
        second = [s for s in points if s.at > middle]
        rss_1, rss_2 = max(s.rss for s in first), max(s.rss for s in second)
        if rss_2 > 1.5 * rss_1 + (64 << 20):
            found.append(Violation(BOUNDED, subject, f"resident memory grew from {rss_1 >> 20} to {rss_2 >> 20} MiB"))
        fds_1, fds_2 = max(s.fds for s in first), max(s.fds for s in second)
        if fds_2 > fds_1 + 100:
            found.append(Violation(BOUNDED, subject, f"file descriptors grew from {fds_1} to {fds_2}"))
    return found
