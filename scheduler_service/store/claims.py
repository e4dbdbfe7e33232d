"""Claims: regular work within concurrency limits and holds, due fixed starts, and work that
needs resources. Each claims for several workers at once (a dispatch group's free slots) and
records every attempt for its own worker in the statement that starts it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from scheduler_service.domain.claim_plan import ClaimPlan, plan_claim
from scheduler_service.domain.planning import RELEASE_LEAD
from scheduler_service.domain.resources import free, pick
from scheduler_service.rows.claims import ClaimedRow, ResourceCandidate, ResourceUse, RunningCount, RunningOn
from scheduler_service.store.base import SEPARATOR, Q, StoreBase


class ClaimStore(StoreBase):
    async def claim(
        self,
        *,
        slots: Sequence[tuple[str, int]],
        queues: Sequence[str],
        worker_types: Sequence[str],
        limits: Mapping[str, int],
        held: Mapping[str, frozenset[str]] | None = None,
        signal: float | None = None,
        pool: str = "default",
    ) -> list[ClaimedRow]:
        """Claims up to one task per free slot of `slots` ((worker id, free slots), in the order
        of domain.dispatch.take_slots: rows go to them as domain.dispatch.hand_out says) in one
        statement: claim_pair for one open (queue, type) and nothing held, which locks rows as it
        reads them off the index; claim_tasks otherwise, whose candidates are planned for twice the
        slots so that a claim meeting another still fills its slots (see both in sql/claims.sql).

        Types with a concurrency limit are locked and counted inside the same transaction, so
        replicas claiming at once never overshoot a limit together. Claims run on the connections
        that keep one generic plan per statement (lowtide.db.connector, _GENERIC_PLANS). `held`
        maps a queue to the types a cost hold holds on it; `signal` is recorded on each claimed task;
        `pool` is the workers' pool (a task naming pools runs only in those, see _pool_allows).
        """
        limit = sum(free for _, free in slots)
        if limit == 0:
            return []
        limited = sorted(t for t in worker_types if t in limits)
        if not limited:
            # Nothing to count first: one statement, committed on its own (no BEGIN and COMMIT
            # round trips around it).
            plan = plan_claim(queues, worker_types, 2 * limit, limits=limits, running={}, held=held)
            sql, params = _claim_statement(slots, plan, limit, signal, pool)
            return await self.db.fetch_as(ClaimedRow, sql, params, planned=True)
        async with self.db.transaction(planned=True) as tx:
            await tx.execute(Q["lock_types"], {"types": limited})
            counts = await tx.fetch_as(RunningCount, Q["count_running_by_type"], {"types": limited})
            running = {r.activity_type: r.running for r in counts}
            plan = plan_claim(queues, worker_types, 2 * limit, limits=limits, running=running, held=held)
            if plan.empty:
                return []
            sql, params = _claim_statement(slots, plan, limit, signal, pool)
            return await tx.fetch_as(ClaimedRow, sql, params)

    async def claim_fixed_due(
        self,
        *,
        slots: Sequence[tuple[str, int]],
        pool: str,
        queues: Sequence[str],
        worker_types: Sequence[str],
        signal: float | None = None,
    ) -> list[ClaimedRow]:
        """Claims due fixed starts of the pool, one per slot of `slots` at most (as `claim`)."""
        if not slots:
            return []
        params = {
            **_slot_params(slots),
            "pool": pool,
            "queues": list(queues),
            "types": list(worker_types),
            "signal": signal,
        }
        return await self.db.fetch_as(ClaimedRow, Q["claim_fixed_due"], params)

    async def claim_with_resources(
        self,
        *,
        fixed_slots: Sequence[str],
        free_slots: Sequence[str],
        pool: str,
        queues: Sequence[str],
        worker_types: Sequence[str],
        held: Mapping[str, frozenset[str]],
        capacities: Mapping[str, int],
        signal: float | None = None,
    ) -> list[ClaimedRow]:
        """Claims due tasks that need resources, as many as fit in what is free now, in order.
        Due fixed starts among them may use held slots (`fixed_slots`: a worker id per busy-or-held
        room), other tasks only free ones (`free_slots`). One lock for all resources keeps replicas
        from granting the same amount twice."""
        room = len(fixed_slots)
        if room == 0:
            return []
        held_pairs = [f"{queue}{SEPARATOR}{name}" for queue, names in held.items() for name in names]
        async with self.db.transaction() as tx:
            await tx.execute(Q["lock_resources"])
            used = {r.name: r.used for r in await tx.fetch_as(ResourceUse, Q["resources_in_use"])}
            candidates = await tx.fetch_as(
                ResourceCandidate,
                Q["resource_candidates"],
                {
                    "pool": pool,
                    "queues": list(queues),
                    "types": list(worker_types),
                    "held": held_pairs,
                    "limit": room * 4,
                    "release_lead": RELEASE_LEAD,
                },
            )
            available = free(capacities, used)
            amounts = [(c.id, {k: int(v) for k, v in c.resources.items()}, c.fixed) for c in candidates]
            chosen_fixed = pick([(i, a) for i, a, fixed in amounts if fixed], available, room)
            for task_id, wants, fixed in amounts:
                if fixed and task_id in chosen_fixed:
                    for name, amount in wants.items():
                        available[name] -= amount
            # Fixed starts take slots first (held ones included); regular tasks the free ones left.
            owners = list(fixed_slots[: len(chosen_fixed)])
            left = _without(free_slots, owners)
            regular = [(i, a) for i, a, fixed in amounts if not fixed]
            chosen_regular = pick(regular, available, min(len(left), room - len(chosen_fixed)))
            chosen = chosen_fixed + chosen_regular
            if not chosen:
                return []
            params = {
                "ids": chosen,
                "slot_workers": owners + left[: len(chosen_regular)],
                "signal": signal,
            }
            return await tx.fetch_as(ClaimedRow, Q["claim_by_ids"], params)

    async def unclaim(self, rows: Sequence[ClaimedRow]) -> None:
        """Hands claimed attempts back untouched (their worker left before they were sent)."""
        params = {
            "ids": [r.id for r in rows],
            "attempts": [r.attempt for r in rows],
            "worker_ids": [r.worker_id for r in rows],
            "release_lead": RELEASE_LEAD,
        }
        await self.db.execute(Q["unclaim_tasks"], params)

    async def running_on_workers(self, worker_ids: Sequence[str], scheduler_id: str) -> list[RunningOn]:
        """The attempts recorded as running on these workers, while they are this replica's."""
        params = {"worker_ids": list(worker_ids), "scheduler_id": scheduler_id}
        return await self.db.fetch_as(RunningOn, Q["running_on_workers"], params)

    async def return_strays(self, refs: Mapping[tuple[int, int], str], scheduler_id: str) -> list[RunningOn]:
        """Puts these attempts ((task id, attempt) -> worker id), which never reached their worker,
        back pending as before their claim; returns those put back (see return_strays)."""
        params = {
            "ids": [task_id for task_id, _ in refs],
            "attempts": [attempt for _, attempt in refs],
            "worker_ids": list(refs.values()),
            "scheduler_id": scheduler_id,
            "release_lead": RELEASE_LEAD,
        }
        return await self.db.fetch_as(RunningOn, Q["return_strays"], params)


def _claim_statement(
    slots: Sequence[tuple[str, int]], plan: ClaimPlan, limit: int, signal: float | None, pool: str
) -> tuple[str, dict[str, object]]:
    """The claim to run for `plan`: claim_pair when it has one open pair and nothing held (the
    rows are locked as they are read, no candidates), claim_tasks otherwise."""
    if len(plan.open) == 1 and not plan.held:
        queue, activity_type, cap = plan.open[0]
        params = {**_slot_params(slots), "queue": queue, "activity_type": activity_type, "cap": min(cap, limit)}
        return Q["claim_pair"], {**params, "signal": signal, "pool": pool, "release_lead": RELEASE_LEAD}
    return Q["claim_tasks"], _claim_params(slots, plan, signal, pool)


def _claim_params(
    slots: Sequence[tuple[str, int]], plan: ClaimPlan, signal: float | None, pool: str
) -> dict[str, object]:
    return {
        **_slot_params(slots),
        "pool": pool,
        "release_lead": RELEASE_LEAD,
        "queues": [p[0] for p in plan.open],
        "types": [p[1] for p in plan.open],
        "caps": [p[2] for p in plan.open],
        "held_queues": [p[0] for p in plan.held],
        "held_types": [p[1] for p in plan.held],
        "held_caps": [p[2] for p in plan.held],
        "signal": signal,
    }


def _slot_params(slots: Sequence[tuple[str, int]]) -> dict[str, str]:
    """The workers and their free slots as _claim_slots (sql/claims.sql) takes them: one string each."""
    return {
        "workers": SEPARATOR.join(worker for worker, _ in slots),
        "free": ",".join(str(free) for _, free in slots),
    }


def _without(slots: Sequence[str], taken: Sequence[str]) -> list[str]:
    """`slots` less one entry of its worker for each slot in `taken` (a fixed start placed there
    uses one of that worker's free slots)."""
    counts = Counter(taken)
    left = []
    for worker in slots:
        if counts[worker] > 0:
            counts[worker] -= 1
        else:
            left.append(worker)
    return left
