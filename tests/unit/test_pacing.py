"""A periodic read whose cost grows with the backlog keeps its interval while it is cheap, and
spends at most READ_SHARE of its period once it is not."""

from __future__ import annotations

import pytest

from scheduler_service.domain.pacing import READ_SHARE, paced


def test_a_cheap_read_keeps_its_interval() -> None:
    assert paced(5.0, 0.002) == 5.0
    assert paced(1.0, READ_SHARE) == 1.0


@pytest.mark.parametrize("took", [0.06, 0.35, 2.0, 30.0])
def test_a_costly_read_waits_long_enough_to_spend_its_share_and_no_longer(took: float) -> None:
    # A backlog of a million pending tasks took 350 ms to count: every 7 s, not every 1 s or 5 s.
    for interval in (1.0, 5.0):
        wait = paced(interval, took)
        assert wait >= interval
        assert took / wait == pytest.approx(READ_SHARE) or wait == interval
        assert took / wait <= READ_SHARE + 1e-12
