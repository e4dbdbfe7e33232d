"""The scheduler's storage adapter: domain values in, rows out, every query from sql/queries.sql.

Every hot-path call works on a batch: one statement stores many submits, claims up to a worker's
free slots, or finishes many attempts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lowtide.db import Database, load_queries
from lowtide.db.connector import Row, Transaction
from lowtide.errors import FailedPrecondition, InvalidArgument, TooLarge
from scheduler_service.domain.fixed import Interval, Miss, Refused, Reservation, admit_all
from scheduler_service.domain.model import Attempt, Kind, NewTask, Outcome, RetryPolicy
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.domain.resources import free, pick
from scheduler_service.domain.skiplist import plan_claim

Q = load_queries("scheduler_service.sql")

_SEPARATOR = "\x1f"


def wake_payload(tasks: Sequence[NewTask]) -> str:
    """The (queue, type) pairs of new tasks as JSON; "*" (wake everyone) when too many to name."""
    pairs = sorted({(t.queue, t.activity_type) for t in tasks})
    text = json.dumps(pairs)
    # NOTIFY payloads must stay under 8000 bytes.
    return text if len(text.encode()) < 7000 else "*"


def _first_new(tasks: Sequence[NewTask], existing: Mapping[str, int]) -> list[int]:
    """Indexes of the tasks this submission will create: no key, or the first of a new key."""
    seen: set[str] = set()
    fresh = []
    for index, task in enumerate(tasks):
        key = task.idempotency_key
        if key is None:
            fresh.append(index)
        elif key not in existing and key not in seen:
            seen.add(key)
            fresh.append(index)
    return fresh


def _submitted(tasks: Sequence[NewTask], inserted: Sequence[Row], existing: Mapping[str, int]) -> list[Submitted]:
    # Identity values grow in insertion order, which is the batch's order.
    new_ids = iter(sorted(r["id"] for r in inserted))
    new_keys = {r["idempotency_key"] for r in inserted if r["idempotency_key"]}
    seen: dict[str, int] = {}
    out: list[Submitted] = []
    for task in tasks:
        key = task.idempotency_key
        if key is None:
            out.append(Submitted(next(new_ids), True))
        elif key in seen:
            out.append(Submitted(seen[key], False))
        elif key in new_keys:
            seen[key] = next(new_ids)
            out.append(Submitted(seen[key], True))
        else:
            seen[key] = existing[key]
            out.append(Submitted(seen[key], False))
    return out


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


def retry_policy_of(row: Mapping[str, Any]) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=row["max_attempts"],
        initial_backoff=timedelta(milliseconds=row["initial_backoff_ms"]),
        backoff_coefficient=row["backoff_coefficient"],
        max_backoff=timedelta(milliseconds=row["max_backoff_ms"]),
        non_retryable_error_types=tuple(row["non_retryable_error_types"]),
    )


def attempt_of(row: Mapping[str, Any]) -> Attempt:
    return Attempt(row["id"], row["attempt"], retry_policy_of(row), fixed=row.get("start_at") is not None)


@dataclass(frozen=True, slots=True)
class Overload:
    """A queue's max_depth, what happens beyond it, and the types held there now (not counted)."""

    max_depth: int
    policy: str
    held: frozenset[str] = frozenset()

    def counts(self, task: NewTask) -> bool:
        """Fixed starts (promised at admission) and held work (waiting for a cheap window, not
        for capacity) neither count against max_depth nor get shed."""
        held = task.activity_type in self.held and task.kind is Kind.ACTIVITY
        return task.fixed is None and not held


@dataclass(frozen=True, slots=True)
class Submitted:
    id: int
    created: bool


ENDED_UNCOMPLETED = frozenset({"failed", "cancelled", "timed_out", "skipped", "shed"})


class Store:
    def __init__(self, db: Database, *, on_unblocked: Callable[[list[Row]], None]) -> None:
        self.db = db
        # Told (after commit) about tasks whose last dependency completed, so dispatch wakes.
        self.on_unblocked = on_unblocked
        # Queues this replica has recorded in lowtide.queues (see register_queues).
        self._registered_queues: set[str] = set()

    async def insert_tasks(
        self,
        tasks: Sequence[NewTask],
        *,
        signal: float | None = None,
        submitted_by: str | None = None,
        capacity: Callable[[str], int] = lambda pool: 1,
        overload: Mapping[str, Overload] | None = None,
    ) -> list[Submitted]:
        """Stores the tasks in one statement and returns their ids in order.

        A task whose idempotency key this submitter used already (stored before, or earlier in
        this batch) is not stored again: its entry carries the first task's id and created=False. Fixed
        starts are admitted first, under a per-pool lock, against the pool's `capacity`; one
        that does not fit raises Refused and nothing of the batch is stored.
        """
        params = {
            "queues": [t.queue for t in tasks],
            "kinds": [t.kind.value for t in tasks],
            "activity_types": [t.activity_type for t in tasks],
            "payloads": [t.payload for t in tasks],
            "priorities": [t.priority for t in tasks],
            "idempotency_keys": [t.idempotency_key for t in tasks],
            "max_attempts": [t.retry.max_attempts for t in tasks],
            "initial_backoff_ms": [_ms(t.retry.initial_backoff) for t in tasks],
            "backoff_coefficients": [t.retry.backoff_coefficient for t in tasks],
            "max_backoff_ms": [_ms(t.retry.max_backoff) for t in tasks],
            "non_retryable": [_SEPARATOR.join(t.retry.non_retryable_error_types) for t in tasks],
            "schedule_to_start_ms": [_ms(t.schedule_to_start) for t in tasks],
            "start_to_close_ms": [_ms(t.start_to_close) for t in tasks],
            "heartbeat_ms": [_ms(t.heartbeat) for t in tasks],
            "max_defer_ms": [_ms(t.max_defer) for t in tasks],
            # The duration of a task with a latest start (for planning), or a fixed start's estimate.
            "estimated_duration_ms": [_ms(t.fixed.estimated_duration) if t.fixed else _ms(t.duration) for t in tasks],
            "pools": [t.pool for t in tasks],
            "start_ats": [t.fixed.start_at if t.fixed else None for t in tasks],
            "start_tolerance_ms": [_ms(t.fixed.tolerance) if t.fixed else None for t in tasks],
            "on_miss": [t.fixed.on_miss.value if t.fixed else None for t in tasks],
            "deps_pending": [0] * len(tasks),
            "resources": [json.dumps(dict(t.resources)) if t.resources else None for t in tasks],
            "latest_starts": [t.latest_start for t in tasks],
            "planned_release_ats": [t.planned_release_at for t in tasks],
            "planned_intensities": [t.planned_intensity for t in tasks],
            "plan_reasons": [t.plan_reason for t in tasks],
            "submitted_by": submitted_by,
            "signal": signal,
            "release_lead": RELEASE_LEAD,
        }
        keys = [t.idempotency_key for t in tasks if t.idempotency_key]
        async with self.db.transaction() as tx:
            existing: dict[str, int] = {}
            if keys:
                rows = await tx.fetch(Q["tasks_by_idempotency_key"], {"keys": keys, "submitted_by": submitted_by})
                existing = {r["idempotency_key"]: r["id"] for r in rows}
            fresh = _first_new(tasks, existing)
            if any(t.depends_on for t in tasks):
                params["deps_pending"] = await self._check_dependencies(tx, tasks)
            if any(tasks[i].fixed for i in fresh):
                await self._admit(tx, [(i, tasks[i]) for i in fresh if tasks[i].fixed], capacity)
            limited = {t.queue: overload[t.queue] for t in tasks if overload and t.queue in overload}
            depths = await self._depths(tx, limited) if limited else {}
            for queue, limit in limited.items():
                adding = sum(1 for i in fresh if tasks[i].queue == queue and limit.counts(tasks[i]))
                if limit.policy == "reject" and depths[queue] + adding > limit.max_depth:
                    raise TooLarge(
                        f"queue {queue} is full: {depths[queue]} claimable tasks pending, max_depth "
                        f"{limit.max_depth} (overflow = reject); retry later"
                    )
            unregistered = {t.queue for t in tasks} - self._registered_queues
            if unregistered:
                await tx.execute(Q["register_queues"], {"queues": sorted(unregistered)})
            inserted = await tx.fetch(Q["insert_tasks"], params)
            if len(inserted) < len(fresh) and keys:
                # Another submit with one of these keys committed meanwhile.
                rows = await tx.fetch(Q["tasks_by_idempotency_key"], {"keys": keys, "submitted_by": submitted_by})
                existing = {r["idempotency_key"]: r["id"] for r in rows}
            out = _submitted(tasks, inserted, existing)
            created_fixed = [(s.id, t) for s, t in zip(out, tasks, strict=True) if s.created and t.fixed]
            if created_fixed:
                await tx.execute(
                    Q["insert_reservations"],
                    {
                        "task_ids": [i for i, _ in created_fixed],
                        "pools": [t.pool for _, t in created_fixed],
                        "starts": [t.fixed.window.start for _, t in created_fixed if t.fixed],
                        "ends": [t.fixed.window.end for _, t in created_fixed if t.fixed],
                    },
                )
            for queue, limit in limited.items():
                made = zip(out, tasks, strict=True)
                adding = sum(1 for s, t in made if s.created and t.queue == queue and limit.counts(t))
                excess = depths[queue] + adding - limit.max_depth
                if limit.policy != "reject" and excess > 0:
                    reason = f"queue {queue} over max_depth {limit.max_depth} ({limit.policy})"
                    params_shed = {"queue": queue, "held": sorted(limit.held), "count": excess, "reason": reason}
                    shed = await tx.fetch(Q[limit.policy], params_shed)
                    await self.settle(tx, shed)
            dependent = [(s.id, d) for s, t in zip(out, tasks, strict=True) if s.created for d in t.depends_on]
            if dependent:
                await tx.execute(
                    Q["insert_dependencies"],
                    {"task_ids": [i for i, _ in dependent], "depends_on": [d for _, d in dependent]},
                )
            if inserted:
                await tx.execute(Q["notify_wake"], {"payload": wake_payload(tasks)})
        if len(self._registered_queues) > 10_000:
            self._registered_queues.clear()  # a bound on memory; the next submit re-registers
        self._registered_queues |= unregistered
        return out

    async def _depths(self, tx: Transaction, limited: Mapping[str, Overload]) -> dict[str, int]:
        await tx.execute(Q["lock_queues"], {"queues": sorted(limited)})
        depths = {}
        for queue, limit in limited.items():
            row = await tx.fetch_one(Q["claimable_depth"], {"queue": queue, "held": sorted(limit.held)})
            depths[queue] = int(row["depth"]) if row else 0
        return depths

    async def _check_dependencies(self, tx: Transaction, tasks: Sequence[NewTask]) -> list[int]:
        """How many unfinished dependencies each task waits for; refuses unknown ones and ones
        that already ended without completing (the task could never run)."""
        wanted = sorted({d for t in tasks for d in t.depends_on})
        rows = await tx.fetch(Q["lock_dependencies"], {"ids": wanted})
        states = {r["id"]: r["state"] for r in rows}
        missing = [d for d in wanted if d not in states]
        if missing:
            raise InvalidArgument("depends_on", f"no task {', '.join(map(str, missing))}")
        ended = [d for d in wanted if states[d] in ENDED_UNCOMPLETED]
        if ended:
            raise FailedPrecondition(
                f"depends_on: task {ended[0]} already ended {states[ended[0]]}, so this task could never run"
            )
        return [sum(1 for d in t.depends_on if states[d] != "completed") for t in tasks]

    async def settle(self, tx: Transaction, ended: Sequence[Row]) -> list[Row]:
        """Dependents of tasks that just ended: released when their last dependency completed,
        failed (transitively) when one ended otherwise. Returns the released ones."""
        completed = [r["id"] for r in ended if r.get("has_dependents") and r["state"] == "completed"]
        failed = [r["id"] for r in ended if r.get("has_dependents") and r["state"] in ENDED_UNCOMPLETED]
        released: list[Row] = []
        if completed:
            rows = await tx.fetch(Q["release_dependents"], {"ids": completed})
            released = [r for r in rows if r["deps_pending"] <= 0]
            if released:
                await tx.execute(Q["notify_wake"], {"payload": "*"})
        if failed:
            await tx.execute(Q["fail_dependents"], {"ids": failed})
        return released

    def _unblocked(self, rows: list[Row]) -> None:
        if rows and self.on_unblocked is not None:
            self.on_unblocked(rows)

    async def _admit(
        self, tx: Transaction, fixed: Sequence[tuple[int, NewTask]], capacity: Callable[[str], int]
    ) -> None:
        pools = sorted({t.pool for _, t in fixed})
        await tx.execute(Q["lock_pools"], {"pools": pools})
        for pool in pools:
            mine = [(i, t.fixed.window) for i, t in fixed if t.pool == pool and t.fixed]
            span_start = min(w.start for _, w in mine)
            span_end = max(w.end for _, w in mine)
            rows = await tx.fetch(
                Q["overlapping_reservations"], {"pool": pool, "window_start": span_start, "window_end": span_end}
            )
            booked = [Reservation(r["task_id"], Interval(r["window_start"], r["window_end"])) for r in rows]
            refused = admit_all(mine, booked, capacity(pool))
            if refused is not None:
                raise Refused(pool, *refused)

    async def get_task(self, task_id: int) -> Row | None:
        return await self.db.fetch_one(Q["get_task"], {"id": task_id})

    async def get_tasks(self, task_ids: Sequence[int]) -> list[Row]:
        return await self.db.fetch(Q["get_tasks"], {"ids": list(task_ids)})

    async def list_tasks(
        self,
        *,
        queue: str | None,
        state: str | None,
        activity_type: str | None,
        before_id: int | None,
        limit: int,
    ) -> list[Row]:
        params = {
            "queue": queue,
            "state": state,
            "activity_type": activity_type,
            "before_id": before_id,
            "limit": limit,
        }
        return await self.db.fetch(Q["list_tasks"], params)

    async def claim(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        worker_types: Sequence[str],
        limit: int,
        limits: Mapping[str, int],
        held: Mapping[str, frozenset[str]] | None = None,
        signal: float | None = None,
    ) -> list[Row]:
        """Claims up to `limit` tasks for one worker in one transaction.

        Types with a concurrency limit are locked and counted inside the same transaction, so
        replicas claiming at once never overshoot a limit together. `held` maps a queue to the
        types a cost hold holds on it; `signal` is recorded on each claimed task.
        """
        async with self.db.transaction() as tx:
            limited = sorted(t for t in worker_types if t in limits)
            running: dict[str, int] = {}
            if limited:
                await tx.execute(Q["lock_types"], {"types": limited})
                rows = await tx.fetch(Q["count_running_by_type"], {"types": limited})
                running = {r["activity_type"]: r["running"] for r in rows}
            plan = plan_claim(queues, worker_types, limit, limits=limits, running=running, held=held)
            if plan.empty:
                return []
            params = {
                "worker_id": worker_id,
                "queues": [p[0] for p in plan.open],
                "types": [p[1] for p in plan.open],
                "caps": [p[2] for p in plan.open],
                "held_queues": [p[0] for p in plan.held],
                "held_types": [p[1] for p in plan.held],
                "held_caps": [p[2] for p in plan.held],
                "limit": limit,
                "signal": signal,
            }
            return await tx.fetch(Q["claim_tasks"], params)

    async def unclaim(self, worker_id: str, attempts: Sequence[tuple[int, int]]) -> None:
        await self.db.execute(
            Q["unclaim_tasks"],
            {"worker_id": worker_id, "ids": [a[0] for a in attempts], "attempts": [a[1] for a in attempts]},
        )

    async def finish(self, outcomes: Sequence[tuple[Outcome, str | None]]) -> set[tuple[int, int]]:
        """Applies outcomes (each with the worker that reported it, or None for the scheduler's own
        verdicts); returns the (id, attempt) pairs that were applied. The rest were stale."""
        params: dict[str, list[Any]] = {
            "ids": [],
            "attempts": [],
            "worker_ids": [],
            "states": [],
            "results": [],
            "error_types": [],
            "error_messages": [],
            "non_retryable": [],
            "run_ats": [],
        }
        for outcome, worker_id in outcomes:
            failure = outcome.failure
            params["ids"].append(outcome.task_id)
            params["attempts"].append(outcome.attempt)
            params["worker_ids"].append(worker_id)
            params["states"].append(outcome.state.value)
            params["results"].append(outcome.result)
            params["error_types"].append(failure.error_type if failure else None)
            params["error_messages"].append(failure.message if failure else None)
            params["non_retryable"].append(failure.non_retryable if failure else None)
            params["run_ats"].append(outcome.run_at)
        async with self.db.transaction() as tx:
            rows = await tx.fetch(Q["finish_attempts"], params)
            released = await self.settle(tx, rows) if any(r["has_dependents"] for r in rows) else []
        self._unblocked(released)
        return {(r["id"], r["attempt"]) for r in rows}

    async def running_attempts_of(self, worker_id: str, scheduler_id: str) -> list[Attempt]:
        """The attempts the worker runs, unless it is connected to another replica than this one."""
        params = {"worker_id": worker_id, "scheduler_id": scheduler_id}
        rows = await self.db.fetch(Q["running_attempts_of_worker"], params)
        return [attempt_of(r) for r in rows]

    async def adopt(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> list[Row]:
        return await self.db.fetch(
            Q["adopt_attempts"],
            {"worker_id": worker_id, "ids": [r[0] for r in refs], "attempts": [r[1] for r in refs]},
        )

    async def expired_attempts(self, limit: int = 1000) -> list[Row]:
        return await self.db.fetch(Q["expired_attempts"], {"limit": limit})

    async def expire_schedule_to_start(self, limit: int = 1000) -> int:
        async with self.db.transaction() as tx:
            rows = await tx.fetch(Q["expire_schedule_to_start"], {"limit": limit})
            await self.settle(tx, rows)
        return len(rows)

    async def heartbeat(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> None:
        await self.db.execute(
            Q["heartbeat_attempts"],
            {"worker_id": worker_id, "ids": [r[0] for r in refs], "attempts": [r[1] for r in refs]},
        )

    async def cancel(self, task_id: int) -> Row | None:
        async with self.db.transaction() as tx:
            row = await tx.fetch_one(Q["cancel_task"], {"id": task_id})
            if row is not None and row["previous_state"] == "running" and row["worker_id"]:
                payload = f"{row['id']}:{row['attempt']}:{row['worker_id']}"
                await tx.execute(Q["notify_cancel"], {"payload": payload})
            if row is not None and row["previous_state"] in ("pending", "running"):
                await self.settle(tx, [row])
            return row

    async def upsert_worker(
        self,
        *,
        worker_id: str,
        pool: str,
        queues: Sequence[str],
        activity_types: Sequence[str],
        slots: int,
        scheduler_id: str,
        lease: timedelta,
    ) -> None:
        await self.db.execute(
            Q["upsert_worker"],
            {
                "id": worker_id,
                "pool": pool,
                "queues": list(queues),
                "activity_types": list(activity_types),
                "slots": slots,
                "scheduler_id": scheduler_id,
                "lease_ms": _ms(lease),
            },
        )

    async def renew_worker(self, worker_id: str, slots: int, lease: timedelta, scheduler_id: str) -> bool:
        """Extends the worker's lease; False when it had run out (or the worker is another replica's)."""
        params = {"id": worker_id, "slots": slots, "lease_ms": _ms(lease), "scheduler_id": scheduler_id}
        return await self.db.execute(Q["renew_worker_lease"], params) > 0

    async def delete_worker(self, worker_id: str, scheduler_id: str) -> None:
        await self.db.execute(Q["delete_worker"], {"id": worker_id, "scheduler_id": scheduler_id})

    async def delete_expired_workers(self) -> None:
        await self.db.execute(Q["delete_expired_workers"])

    async def try_lead(self, name: str, holder: str, ttl: timedelta) -> bool:
        row = await self.db.fetch_one(Q["try_lead"], {"name": name, "holder": holder, "ttl_ms": _ms(ttl)})
        return row is not None

    async def resign(self, name: str, holder: str) -> None:
        await self.db.execute(Q["resign"], {"name": name, "holder": holder})

    async def replica_seen(self, replica: str) -> None:
        await self.db.execute(Q["replica_seen"], {"id": replica})

    async def replica_stopped(self, replica: str) -> None:
        await self.db.execute(Q["replica_stopped"], {"id": replica})

    async def forget_replicas(self) -> None:
        await self.db.execute(Q["forget_replicas"])

    async def now(self) -> datetime:
        row = await self.db.fetch_one(Q["now"])
        assert row is not None
        value: datetime = row["now"]
        return value

    async def pause_queue(self, name: str) -> Row:
        row = await self.db.fetch_one(Q["pause_queue"], {"name": name})
        assert row is not None
        return row

    async def resume_queue(self, name: str) -> bool:
        """Resumes the queue and moves its schedule_to_start deadlines past the pause."""
        async with self.db.transaction() as tx:
            row = await tx.fetch_one(Q["resume_queue"], {"name": name})
            if row is None:
                return False
            await tx.execute(Q["shift_schedule_to_start"], {"name": name, "paused_for": row["paused_for"]})
            return True

    async def paused_queues(self) -> dict[str, datetime]:
        return {r["name"]: r["paused_at"] for r in await self.db.fetch(Q["paused_queues"])}

    async def pending_by_queue_and_type(self) -> list[Row]:
        return await self.db.fetch(Q["pending_by_queue_and_type"])

    async def known_queues(self) -> set[str]:
        return {r["name"] for r in await self.db.fetch(Q["known_queues"])}

    async def running_by_queue(self) -> dict[str, int]:
        return {r["queue"]: r["running"] for r in await self.db.fetch(Q["running_by_queue"])}

    async def pools(self) -> list[Row]:
        return await self.db.fetch(Q["pools"])

    async def carbon_by_type(self, types: Sequence[str]) -> list[Row]:
        return await self.db.fetch(Q["carbon_by_type"], {"types": list(types)})

    async def workers_for_type(self, queue: str, activity_type: str) -> int:
        row = await self.db.fetch_one(Q["workers_for_type"], {"queue": queue, "activity_type": activity_type})
        return int(row["workers"]) if row else 0

    async def running_of_type(self, activity_type: str) -> int:
        rows = await self.db.fetch(Q["count_running_by_type"], {"types": [activity_type]})
        return int(rows[0]["running"]) if rows else 0

    async def claim_fixed_due(
        self,
        *,
        worker_id: str,
        pool: str,
        queues: Sequence[str],
        worker_types: Sequence[str],
        limit: int,
        signal: float | None = None,
    ) -> list[Row]:
        params = {
            "worker_id": worker_id,
            "pool": pool,
            "queues": list(queues),
            "types": list(worker_types),
            "limit": limit,
            "signal": signal,
        }
        return await self.db.fetch(Q["claim_fixed_due"], params)

    async def upcoming_fixed(self, pools: Sequence[str], horizon: datetime) -> list[Row]:
        return await self.db.fetch(Q["upcoming_fixed"], {"pools": list(pools), "horizon": horizon})

    async def apply_misses(self, reason_of: Callable[[Row], Miss], *, lease: timedelta) -> list[Row]:
        """Marks first attempts not started by start + tolerance; returns what was applied. A
        replica not seen for `lease` (and not stopped cleanly) counts as gone."""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(Q["missed_fixed"], {"lease_ms": _ms(lease)})
            if not rows:
                return []
            misses = [reason_of(r) for r in rows]
            params = {
                "ids": [r["id"] for r in rows],
                "reasons": [m.message for m in misses],
                "kinds": [m.kind for m in misses],
            }
            marked = await tx.fetch(Q["mark_missed"], params)
            await self.settle(tx, marked)
            return marked

    async def pool_fixed_stats(self) -> list[Row]:
        return await self.db.fetch(Q["pool_fixed_stats"])

    async def claim_with_resources(
        self,
        *,
        worker_id: str,
        pool: str,
        queues: Sequence[str],
        worker_types: Sequence[str],
        held: Mapping[str, frozenset[str]],
        capacities: Mapping[str, int],
        limit: int,
        room: int,
        signal: float | None = None,
    ) -> list[Row]:
        """Claims due tasks that need resources, as many as fit in what is free now, in order.
        One lock for all resources keeps replicas from granting the same amount twice."""
        held_pairs = [f"{queue}{_SEPARATOR}{name}" for queue, names in held.items() for name in names]
        async with self.db.transaction() as tx:
            await tx.execute(Q["lock_resources"])
            used = {r["name"]: r["used"] for r in await tx.fetch(Q["resources_in_use"])}
            candidates = await tx.fetch(
                Q["resource_candidates"],
                {
                    "pool": pool,
                    "queues": list(queues),
                    "types": list(worker_types),
                    "held": held_pairs,
                    "limit": max(room, 1) * 4,
                },
            )
            # Due fixed starts may use held slots (room); other tasks only free ones (limit).
            available = free(capacities, used)
            amounts = [(r["id"], {k: int(v) for k, v in r["resources"].items()}, r["fixed"]) for r in candidates]
            chosen = pick([(i, a) for i, a, fixed in amounts if fixed], available, room)
            for task_id, wants, fixed in amounts:
                if fixed and task_id in chosen:
                    for name, amount in wants.items():
                        available[name] -= amount
            regular = [(i, a) for i, a, fixed in amounts if not fixed]
            chosen += pick(regular, available, min(limit, room - len(chosen)))
            if not chosen:
                return []
            return await tx.fetch(Q["claim_by_ids"], {"ids": chosen, "worker_id": worker_id, "signal": signal})

    async def plannable_tasks(self) -> list[Row]:
        return await self.db.fetch(Q["plannable_tasks"])

    async def apply_plans(self, plans: Sequence[tuple[int, datetime | None, float | None, str]]) -> None:
        """Stores the plans and tells every replica (NOTIFY, at commit) to time its wake-ups."""
        if not plans:
            return
        params = {
            "ids": [p[0] for p in plans],
            "release_ats": [p[1] for p in plans],
            "intensities": [p[2] for p in plans],
            "reasons": [p[3] for p in plans],
            "release_lead": RELEASE_LEAD,
        }
        async with self.db.transaction() as tx:
            await tx.execute(Q["apply_plans"], params)
            await tx.execute(Q["notify_plans"])

    async def upcoming_releases(self, horizon: timedelta) -> list[datetime]:
        return [row["due"] for row in await self.db.fetch(Q["upcoming_releases"], {"horizon": horizon})]

    async def live_reservations(self) -> list[Row]:
        return await self.db.fetch(Q["live_reservations"])
