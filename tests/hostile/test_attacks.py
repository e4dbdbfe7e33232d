"""Both services against hostile HTTP/2 clients (tests/hostile/attacks.py), one attack at a time,
each bounded in count and in time, on loopback. While each runs, a well-behaved subscriber and
clients calling SetSignal and SubmitTask every 0.25 s say what a user would notice. Each attack
must leave the service up and serving, the subscriber getting every change through to the last,
every call answered within a bound set generously for a loaded 2-core machine, and the attacked
process's memory bounded."""

from __future__ import annotations

import pytest

from tests.helpers import eventually
from tests.hostile.attacks import ATTACKS
from tests.hostile.canary import Services, run_attack, serving

# Each attack runs this long; the whole suite (14 attacks x 2 services) stays within minutes.
SECONDS = 2.5
# Every SetSignal and SubmitTask beside an attack answers within this (they take milliseconds
# when nothing attacks; the bound is for a shared, loaded 2-core machine).
CALL_BOUND = 5.0
# The attacked process may grow by at most this much while it is attacked (grpc's buffers, a
# message being refused); a server that buffers what an attacker sends grows by hundreds of MB.
RSS_GROWTH_BOUND = 256 * 2**20
# Both services answer health checks again within this of the attack's end. A flood of reset
# streams leaves grpc.aio a backlog of calls to retire one by one in Python; while it is over
# `grpc.server.max_pending_requests` (grpc core's default, 1,000), grpc core sheds new calls with
# CANCELLED rather than queue them without bound, for a fraction of a second on this machine.
RECOVERY_BOUND = 15.0


@pytest.mark.parametrize("victim", ["signal", "scheduler"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_the_service_shrugs_the_attack_off(hostile_services: Services, attack: str, victim: str) -> None:
    service = hostile_services.by_name(victim)
    figures = await run_attack(hostile_services, attack, victim, seconds=SECONDS)
    context = f"{attack} on {victim}: {figures.summary()}\n{hostile_services.logs()}"

    assert "error" not in figures.attacker, context
    # Up, and serving again, both of them.
    assert service.process.poll() is None, context
    for each in (hostile_services.signal, hostile_services.scheduler):
        await eventually(lambda: serving(each.target), within=RECOVERY_BOUND, interval=0.1)  # noqa: B023
    # Every call answered, in time.
    assert not figures.failures, context
    assert figures.set_latencies and figures.submit_latencies, context
    assert max(figures.set_latencies) < CALL_BOUND, context
    assert max(figures.submit_latencies) < CALL_BOUND, context
    # The subscriber kept getting changes, through to the last one made.
    assert len(figures.versions_seen) >= 3, context
    assert figures.versions_seen[-1] == figures.last_version_set, context
    # Memory bounded.
    assert figures.peak_rss - figures.rss_before < RSS_GROWTH_BOUND, context
