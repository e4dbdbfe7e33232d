"""How a group's claim hands its rows out: one slot of every worker in turn."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.domain.dispatch import hand_out, take_slots


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


def _free(worker: tuple[str, int]) -> int:
    return worker[1]


def test_a_claim_takes_slots_up_to_its_bound_and_the_next_one_starts_past_it() -> None:
    workers = [("a", 4), ("b", 0), ("c", 4), ("d", 4)]
    taken, next_start = take_slots(workers, _free, 0, 6)
    # The last worker's count is cut to fit; b, with nothing free, is passed over.
    assert [(w[0], n) for w, n in taken] == [("a", 4), ("c", 2)]
    assert next_start == 3
    taken, next_start = take_slots(workers, _free, next_start, 6)
    assert [(w[0], n) for w, n in taken] == [("d", 4), ("a", 2)]
    assert next_start == 1


def test_a_claim_that_looks_at_every_worker_moves_the_start_one_on() -> None:
    workers = [("a", 1), ("b", 1), ("c", 1)]
    taken, next_start = take_slots(workers, _free, 2, 100)
    assert [w[0] for w, _ in taken] == ["c", "a", "b"]
    assert next_start == 0
    assert take_slots([], _free, 5, 10) == ([], 5)


def test_a_bounded_claim_asks_only_the_workers_it_looks_at() -> None:
    asked: list[str] = []

    def free(worker: tuple[str, int]) -> int:
        asked.append(worker[0])
        return worker[1]

    workers = [(f"w{i}", 4) for i in range(1000)]
    taken, _ = take_slots(workers, free, 10, 32)
    assert sum(n for _, n in taken) == 32
    assert asked == [f"w{i}" for i in range(10, 18)]


@given(st.lists(st.integers(0, 6), max_size=40), st.integers(1, 30), st.integers(0, 50))
def test_bounded_claims_in_turn_reach_every_worker_with_a_free_slot(free: list[int], most: int, start: int) -> None:
    workers = [(f"w{i}", n) for i, n in enumerate(free)]
    reached: set[str] = set()
    for _ in range(len(workers) + 1):
        taken, start = take_slots(workers, _free, start, most)
        assert sum(n for _, n in taken) <= most
        assert all(0 < n <= w[1] for w, n in taken)
        reached.update(w[0] for w, _ in taken)
    assert reached == {w for w, n in workers if n}
