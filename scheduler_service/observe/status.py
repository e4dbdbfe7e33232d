"""The status read model: what GetStatus and the queue gauges say of the backlog, with one rule
for which pending work is held and which a worker could claim now."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lowtide.config import Config
from lowtide_proto.lowtide.v1 import scheduler_pb2
from scheduler_service.domain.carbon import Totals
from scheduler_service.holds.cost import CostHolds
from scheduler_service.holds.signals import SignalHolds
from scheduler_service.rows.fleet import PendingGroup


def held(holds: SignalHolds, group: PendingGroup) -> bool:
    """Whether a cost hold holds this pending work now (it waits for a cheaper window)."""
    return group.kind == "activity" and group.activity_type in holds.held_for(group.queue)


def queue_statuses(
    holds: SignalHolds,
    paused: Iterable[str],
    pending: Iterable[PendingGroup],
    running: Mapping[str, int],
    configured: Iterable[str],
) -> list[scheduler_pb2.QueueStatus]:
    """Every queue paused, running or configured, and every queue with pending work: its held and
    claimable backlog apart, sorted by name."""
    paused_names = set(paused)
    queues: dict[str, scheduler_pb2.QueueStatus] = {}

    def queue(name: str) -> scheduler_pb2.QueueStatus:
        if name not in queues:
            queues[name] = scheduler_pb2.QueueStatus(
                name=name,
                paused=name in paused_names,
                running=running.get(name, 0),
                cost_hold=holds.active_on(name),
                held_types=sorted(holds.held_for(name)),
            )
        return queues[name]

    for name in [*paused_names, *running, *configured]:
        queue(name)
    for group in pending:
        status = queue(group.queue)
        if held(holds, group):
            status.held_depth += group.depth
            status.oldest_held_age_seconds = max(status.oldest_held_age_seconds, group.oldest_age)
        else:
            status.depth += group.depth
            status.oldest_pending_age_seconds = max(status.oldest_pending_age_seconds, group.oldest_age)
    return [queues[name] for name in sorted(queues)]


def carbon_statuses(totals: Mapping[str, Totals]) -> list[scheduler_pb2.CarbonStatus]:
    """Per deferrable type with tasks counted: the mean signal at their submit and at their dispatch."""
    carbon = []
    for activity_type, counted in sorted(totals.items()):
        if counted.tasks:
            at_submit, at_dispatch = counted.means()
            carbon.append(
                scheduler_pb2.CarbonStatus(
                    activity_type=activity_type,
                    tasks=counted.tasks,
                    mean_at_submit=at_submit,
                    mean_at_dispatch=at_dispatch,
                )
            )
    return carbon


def hold_status(config: Config, name: str, holds: CostHolds, types: list[str]) -> scheduler_pb2.HoldStatus:
    """One signal's hold as GetStatus shows it."""
    signal = holds.signal
    # Until the signal service has told its threshold: the configured one.
    configured = config.signals.get(name)
    threshold = config.cost.defer_threshold
    if configured is not None and name != config.cost.signal:
        threshold = configured.threshold
    hold = scheduler_pb2.HoldStatus(
        signal=name,
        active=holds.state.active,
        threshold=signal.threshold if signal else threshold,
        stale=bool(signal and signal.stale),
        reason=holds.state.reason,
        types=types,
    )
    if signal is not None and signal.value is not None:
        hold.value = signal.value
    if holds.state.since is not None:
        hold.since.FromDatetime(holds.state.since)
    return hold
