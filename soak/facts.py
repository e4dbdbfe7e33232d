"""What a soak records, as plain values: the invariants (soak.invariants) are pure functions of
these, so each can be tried on a crafted history without running anything.

Times are seconds since the epoch (float), on this machine's clock: the services, the database
and the workers all run here, so one clock orders every fact.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where a task ends: nothing moves it again unless someone asks (a retry).
TERMINAL = frozenset({"completed", "failed", "cancelled", "timed_out", "skipped", "shed"})


@dataclass(frozen=True, slots=True)
class Ack:
    """A submit the scheduler acknowledged: the idempotency key sent and the task id answered."""

    key: str
    task_id: int
    at: float


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One task as the database has it (read-only), with the soak's tag from its payload."""

    id: int
    key: str | None
    tag: str | None
    activity_type: str
    state: str
    attempt: int
    worker_id: str | None
    started_at: float | None
    released_by: str | None = None
    signal_at_dispatch: float | None = None
    start_at: float | None = None
    start_tolerance: float | None = None
    start_hit: bool | None = None
    missed: bool = False
    miss_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Execution:
    """An attempt as a worker ran it, from the worker's own record: begun when the activity was
    called, ended when it returned (ok) or raised (not ok); end None while it runs, or when the
    worker died first."""

    worker: str
    pid: int
    task_id: int
    attempt: int
    start: float
    end: float | None = None
    ok: bool | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault injected: `kind` kill, stop (SIGSTOP until `until`) or cut (worker connections
    reset); `target` the process's name (scheduler-1, worker-py-0, signal, postgres) or
    `workers` for a cut. `until` is when it was undone (restarted, continued)."""

    kind: str
    target: str
    at: float
    until: float
    pid: int = 0


@dataclass(frozen=True, slots=True)
class SignalPoint:
    """A value of the cost signal as the signal service recorded it."""

    at: float
    value: float


@dataclass(frozen=True, slots=True)
class Sample:
    """A service process's resident memory (bytes) and open file descriptors at one moment."""

    process: str
    pid: int
    at: float
    rss: int
    fds: int


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.subject}: {self.detail}"
