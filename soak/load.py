"""The soak's load: every kind of work, drawn from the seed, submitted to either replica through
the public client, each submit with an idempotency key that is also its tag in the payload.

An acknowledged submit is recorded (soak.facts.Ack) the moment its answer arrives; a submit that
got no answer (a replica down or frozen) is sent again, same key, to the other replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc

from lowtide_client import Client, task_spec
from lowtide_proto.lowtide.v1 import task_pb2
from soak.facts import Ack

# How long one call may take before the other replica is asked (a frozen replica never answers).
CALL_TIMEOUT = 12.0
# The load's mix: operation and weight.
MIX = (
    ("plain", 30),
    ("batch", 6),
    ("defer", 16),
    ("fixed", 5),
    ("flaky", 9),
    ("doomed", 3),
    ("dependent", 6),
    ("resubmit", 8),
    ("cancel", 6),
    ("retry", 3),
)
PAYLOAD_SIZES = (0, 16, 200, 2_000, 20_000, 200_000)
SCHEDULES = ("soak-every-minute", "soak-every-other-minute")


class Load:
    def __init__(self, seed: int, targets: Sequence[str], rate: float, acks_file: Path) -> None:
        self._rng = random.Random(f"load:{seed}")
        self._seed = seed
        self._clients = [Client(t) for t in targets]
        self._rate = rate
        self._acks_file = acks_file.open("a", encoding="utf-8")
        self.acks: list[Ack] = []
        # Re-submits of acknowledged keys that were refused: (key, status and message).
        self.refused_resubmits: list[tuple[str, str]] = []
        self.done: Counter[str] = Counter()
        self._n = 0
        self._specs: dict[str, task_pb2.TaskSpec] = {}
        self._acked: list[tuple[str, int]] = []
        self._doomed: list[int] = []

    def _key(self) -> str:
        self._n += 1
        return f"soak-{self._seed}-{self._n}"

    def _payload(self, key: str) -> bytes:
        size = int(self._rng.choice(PAYLOAD_SIZES) * self._rng.random())
        return key.encode() + b"|" + self._rng.randbytes(size)

    def _headers(self, **more: str) -> dict[str, str]:
        return {"soak-nap-ms": str(self._rng.randint(0, 400)), **more}

    async def _call(self, op: str, call: Any) -> Any:
        """`call(client)` on a replica drawn at random, then on the other when it gives no answer.
        None when neither answered; errors other than silence are raised."""
        first = self._rng.randrange(len(self._clients))
        for n in range(len(self._clients)):
            client = self._clients[(first + n) % len(self._clients)]
            try:
                return await asyncio.wait_for(call(client), CALL_TIMEOUT)
            except TimeoutError:
                self.done[f"{op}: no answer, sent to the other replica"] += 1
            except grpc.aio.AioRpcError as error:
                if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                self.done[f"{op}: unavailable, sent to the other replica"] += 1
        self.done[f"{op}: never answered"] += 1
        return None

    def _ack(self, key: str, task_id: int) -> None:
        ack = Ack(key, task_id, datetime.now(UTC).timestamp())
        self.acks.append(ack)
        self._acks_file.write(json.dumps({"key": key, "id": task_id, "at": ack.at}) + "\n")
        self._acked.append((key, task_id))

    async def _submit(self, op: str, spec: task_pb2.TaskSpec) -> int | None:
        self._specs[spec.idempotency_key] = spec
        try:
            task = await self._call(op, lambda c: c._submit_spec(spec))
        except grpc.aio.AioRpcError as error:
            self.done[f"{op}: refused ({error.code().name})"] += 1
            if op == "resubmit":
                self.refused_resubmits.append((spec.idempotency_key, f"{error.code().name}: {error.details()}"))
            return None
        if task is None:
            return None
        self._ack(spec.idempotency_key, int(task.id))
        self.done[op] += 1
        return int(task.id)

    def _spec(self, activity: str, **options: Any) -> task_pb2.TaskSpec:
        key = self._key()
        options.setdefault("headers", self._headers())
        return task_spec(activity, self._payload(key), idempotency_key=key, **options)

    async def one(self) -> None:
        op = self._rng.choices([m for m, _ in MIX], [w for _, w in MIX])[0]
        now = datetime.now(UTC)
        rng = self._rng
        if op == "plain":
            await self._submit(op, self._spec("plain", priority=rng.randint(0, 3)))
        elif op == "batch":
            await self._batch([self._spec("plain") for _ in range(rng.randint(2, 50))])
        elif op == "defer":
            deadline = now + timedelta(seconds=rng.uniform(20, 60)) if rng.random() < 0.5 else None
            await self._submit(
                op,
                self._spec(
                    "defer",
                    max_defer=timedelta(seconds=rng.uniform(5, 45)),
                    deadline=deadline,
                    estimated_duration=timedelta(seconds=1) if deadline else None,
                ),
            )
        elif op == "fixed":
            spec = self._spec(
                "fixed",
                queue="fixed",
                pool="fixed",
                start_in=timedelta(seconds=rng.uniform(5, 40)),
                start_tolerance=timedelta(seconds=2),
                estimated_duration=timedelta(seconds=1),
                on_miss=rng.choice(("run_late", "skip")),
            )
            await self._submit(op, spec)
        elif op == "flaky":
            headers = self._headers(**{"soak-fail-until": str(rng.randint(2, 3))})
            spec = self._spec("flaky", headers=headers, max_attempts=4, initial_backoff=timedelta(milliseconds=200))
            await self._submit(op, spec)
        elif op == "doomed":
            spec = self._spec("doomed", max_attempts=3, non_retryable_error_types=["Doomed"])
            if (task_id := await self._submit(op, spec)) is not None:
                self._doomed.append(task_id)
        elif op == "dependent":
            parent = await self._submit(op, self._spec(rng.choice(("plain", "flaky", "doomed"))))
            if parent is not None:
                await self._submit(op, self._spec("plain", depends_on=[parent]))
        else:
            await self._control(op)

    async def _batch(self, specs: list[task_pb2.TaskSpec]) -> None:
        for spec in specs:
            self._specs[spec.idempotency_key] = spec
        try:
            answer = await self._call("batch", lambda c: c.submit_many(specs))
        except grpc.aio.AioRpcError as error:
            self.done[f"batch: refused ({error.code().name})"] += 1
            return
        if answer is not None:
            for spec, submitted in zip(specs, answer, strict=True):
                self._ack(spec.idempotency_key, int(submitted.id))
            self.done["batch"] += 1
            self.done["batch tasks"] += len(specs)

    async def _control(self, op: str) -> None:
        """An idempotent re-submit of an acknowledged task, a cancel, or a retry of a doomed one."""
        if not self._acked:
            return
        if op == "resubmit":
            key, _ = self._rng.choice(self._acked[-500:])
            await self._submit(op, self._specs[key])
            return
        try:
            if op == "cancel":
                _, task_id = self._rng.choice(self._acked[-50:])
                if await self._call(op, lambda c: c.cancel(task_id)) is not None:
                    self.done[op] += 1
            elif self._doomed:
                task_id = self._doomed.pop(self._rng.randrange(len(self._doomed)))
                task = await self._call(op, lambda c: c.get(task_id))
                failed = task is not None and task.state == task_pb2.TASK_STATE_FAILED
                if failed and await self._call(op, lambda c: c.retry(task_id, if_attempt=task.attempt)) is not None:
                    self.done[op] += 1
        except grpc.aio.AioRpcError as error:
            self.done[f"{op}: refused ({error.code().name})"] += 1

    async def schedules(self, create: bool) -> None:
        """Two schedules of fixed starts in the fixed pool while the load runs; deleted after."""
        for name, cron in zip(SCHEDULES, ("* * * * *", "*/2 * * * *"), strict=True):
            with contextlib.suppress(grpc.aio.AioRpcError):
                if create:
                    call = await self._call(
                        "schedule",
                        lambda c, n=name, cr=cron: c.create_schedule(
                            n,
                            cr,
                            "fixed",
                            b"",
                            queue="fixed",
                            pool="fixed",
                            estimated_duration=timedelta(seconds=1),
                            start_tolerance=timedelta(seconds=2),
                        ),
                    )
                    if call is not None:
                        self.done["schedules created"] += 1
                else:
                    await self._call("schedule", lambda c, n=name: c.delete_schedule(n))

    async def run(self, stop: asyncio.Event, in_flight: int = 16) -> None:
        """Operations at `rate` a second (at most `in_flight` at once) until `stop`."""
        await self.schedules(create=True)
        running: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(in_flight)

        async def guarded() -> None:
            try:
                await self.one()
            except Exception as error:  # a load operation's own mistake is counted, never fatal
                self.done[f"load error: {type(error).__name__}: {error}"[:120]] += 1
            finally:
                room.release()

        while not stop.is_set():
            await room.acquire()
            task = asyncio.create_task(guarded())
            running.add(task)
            task.add_done_callback(running.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._rng.expovariate(self._rate))
        await asyncio.gather(*running, return_exceptions=True)
        await self.schedules(create=False)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        self._acks_file.close()
