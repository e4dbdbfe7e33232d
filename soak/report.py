"""The soak's one summary: the work done, the faults injected by kind, and each invariant with
its count of violations (the first few of each told in full)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from soak.facts import Violation
from soak.invariants import INVARIANTS

if TYPE_CHECKING:
    from soak.load import Load
    from soak.stack import Settings, Soak

SHOWN = 5


def summary(
    settings: Settings,
    soak: Soak,
    *,
    load: Load,
    work: Mapping[str, int],
    violations: Sequence[Violation],
    planned: int,
) -> str:
    lines = [f"soak summary: seed {settings.seed}, {settings.duration:g} s of faults, load {settings.rate:g}/s"]
    lines.append("workers: " + ", ".join(w.name for w in soak.workers))
    lines += [f"  {note}" for note in soak.notes]
    lines.append("work done:")
    lines += [f"  {name:<48} {count}" for name, count in sorted(work.items())]
    lines.append("load operations (acknowledged, or what happened instead):")
    lines += [f"  {name:<48} {count}" for name, count in sorted(load.done.items())]
    kinds = Counter(f"{f.kind} {f.target.split('-')[0]}" for f in soak.faults)
    lines.append(f"faults injected: {len(soak.faults)} of {planned} planned")
    lines += [f"  {name:<48} {count}" for name, count in sorted(kinds.items())]
    lines += [f"  skipped: {name:<39} {count}" for name, count in sorted(soak.skipped.items())]
    if soak.exits:
        lines.append("processes that exited by themselves (restarted):")
        lines += [f"  {name:<48} {count}" for name, count in sorted(soak.exits.items())]
    by_invariant = Counter(v.invariant for v in violations)
    lines.append("invariants (violations):")
    lines += [f"  {name:<48} {by_invariant[name]}" for name in INVARIANTS]
    for name in INVARIANTS:
        shown = [v for v in violations if v.invariant == name][:SHOWN]
        lines += [f"  ! {v}" for v in shown]
    verdict = "FAILED" if violations else "passed"
    lines.append(f"soak {verdict}: {len(violations)} violation(s); replay with --seed {settings.seed}")
    return "\n".join(lines) + "\n"
