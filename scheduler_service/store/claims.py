"""Claims: regular work within concurrency limits and holds, due fixed starts, and work that needs resources."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lowtide.db.connector import Row
from scheduler_service.domain.resources import free, pick
from scheduler_service.domain.skiplist import plan_claim
from scheduler_service.store.base import SEPARATOR, Q, StoreBase


class ClaimStore(StoreBase):
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
        held_pairs = [f"{queue}{SEPARATOR}{name}" for queue, names in held.items() for name in names]
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
