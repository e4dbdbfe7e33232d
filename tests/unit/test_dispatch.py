"""How a group's claim hands its rows out: one slot of every worker in turn."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.domain.dispatch import hand_out


def test_the_first_rows_go_to_different_workers() -> None:
    assert hand_out([("a", 3), ("b", 1), ("c", 2)]) == ["a", "b", "c", "a", "c", "a"]


def test_the_start_rotates_which_worker_is_first() -> None:
    assert hand_out([("a", 1), ("b", 1), ("c", 1)], start=1) == ["b", "c", "a"]
    assert hand_out([("a", 1), ("b", 1), ("c", 1)], start=5) == ["c", "a", "b"]


def test_workers_without_a_free_slot_get_nothing() -> None:
    assert hand_out([("a", 0), ("b", 2)]) == ["b", "b"]
    assert hand_out([]) == []


@given(st.lists(st.integers(0, 20), max_size=30), st.integers(0, 100), st.integers(0, 400))
def test_every_slot_once_and_any_prefix_is_fair(free: list[int], start: int, taken: int) -> None:
    workers = [(f"w{i}", n) for i, n in enumerate(free)]
    owners = hand_out(workers, start)
    assert Counter(owners) == Counter({w: n for w, n in workers if n})
    # However many rows a claim takes, two workers that both still had a free slot differ by at most one.
    got = Counter(owners[:taken])
    for a, free_a in workers:
        for b, free_b in workers:
            if got[a] < free_a and got[b] < free_b:
                assert abs(got[a] - got[b]) <= 1
