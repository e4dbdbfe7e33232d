"""Resources: validation against capacities, and strict-order fitting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.errors import InvalidArgument
from scheduler_service.domain.resources import free, pick, validate

CAPACITY = {"gpu": 2, "license": 1}


def test_only_configured_resources_within_capacity() -> None:
    assert validate({"gpu": 1, "license": 0}, CAPACITY) == {"gpu": 1}
    with pytest.raises(InvalidArgument, match="unknown resource 'tpu'"):
        validate({"tpu": 1}, CAPACITY)
    with pytest.raises(InvalidArgument, match="gpu: 3 is more than the capacity 2"):
        validate({"gpu": 3}, CAPACITY)


def test_candidates_fit_in_order_and_the_first_misfit_stops_the_batch() -> None:
    available = free(CAPACITY, {"gpu": 1})
    assert pick([(1, {"gpu": 1}), (2, {"gpu": 1}), (3, {"license": 1})], available, 10) == [1]
    assert pick([(1, {"license": 1}), (2, {"gpu": 1})], available, 10) == [1, 2]
    assert pick([(1, {"gpu": 1})], available, 0) == []


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), max_size=20),
    st.integers(0, 2),
    st.integers(0, 1),
)
def test_picked_tasks_never_exceed_what_is_free(wants: list[tuple[int, int]], gpu_used: int, lic_used: int) -> None:
    candidates = [(i, {"gpu": g, "license": lic}) for i, (g, lic) in enumerate(wants)]
    available = free(CAPACITY, {"gpu": gpu_used, "license": lic_used})
    chosen = set(pick(candidates, available, 100))
    assert sum(c[1]["gpu"] for c in candidates if c[0] in chosen) <= available["gpu"]
    assert sum(c[1]["license"] for c in candidates if c[0] in chosen) <= available["license"]
