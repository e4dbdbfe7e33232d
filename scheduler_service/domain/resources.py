"""Named resources: capacities from `[resources]`, amounts per task, and which waiting tasks fit.

A task that needs resources runs only when its amounts are free. Candidates are taken strictly
in order (fixed starts first, then priority, then FIFO): the first that does not fit stops the
batch, so a large request is never starved by a stream of small ones slipping past it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lowtide.errors import InvalidArgument


def validate(amounts: Mapping[str, int], capacities: Mapping[str, int]) -> dict[str, int]:
    """The amounts a task asks for, refused when a name is not configured or an amount could
    never be free (more than the whole capacity)."""
    out: dict[str, int] = {}
    for name, amount in sorted(amounts.items()):
        if name not in capacities:
            known = ", ".join(sorted(capacities)) or "none are configured"
            raise InvalidArgument("resources", f"unknown resource {name!r} ({known})")
        if amount > capacities[name]:
            raise InvalidArgument("resources", f"{name}: {amount} is more than the capacity {capacities[name]}")
        if amount > 0:
            out[name] = amount
    return out


def free(capacities: Mapping[str, int], used: Mapping[str, int]) -> dict[str, int]:
    return {name: capacity - used.get(name, 0) for name, capacity in capacities.items()}


def pick(candidates: Sequence[tuple[int, Mapping[str, int]]], available: Mapping[str, int], limit: int) -> list[int]:
    """The ids (in order) of the leading candidates whose amounts fit together, at most `limit`."""
    left = dict(available)
    chosen: list[int] = []
    for task_id, amounts in candidates:
        if len(chosen) >= limit or any(amount > left.get(name, 0) for name, amount in amounts.items()):
            break
        for name, amount in amounts.items():
            left[name] -= amount
        chosen.append(task_id)
    return chosen
