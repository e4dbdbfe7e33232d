"""The carbon totals' arithmetic (domain.carbon): what counts, and how totals add up."""

from __future__ import annotations

from scheduler_service.domain.carbon import Totals, merged, tally


def test_a_task_counts_once_at_its_first_dispatch_and_only_with_both_signals_known() -> None:
    counted = tally(
        [
            ("train", 1, 500.0, 100.0),
            ("train", 1, 300.0, 200.0),
            ("train", 2, 999.0, 999.0),  # a retry: the same task again
            ("train", 1, None, 100.0),  # submitted before any signal was known
            ("index", 1, 400.0, None),
            ("index", 1, 200.0, 200.0),
        ]
    )
    assert counted == {"train": Totals(2, 800.0, 300.0), "index": Totals(1, 200.0, 200.0)}
    assert counted["train"].means() == (400.0, 150.0)
    assert Totals().means() == (0.0, 0.0)


def test_totals_merge_per_type_without_changing_their_parts() -> None:
    written = {"train": Totals(2, 800.0, 300.0)}
    unwritten = {"train": Totals(1, 100.0, 100.0), "index": Totals(1, 50.0, 40.0)}
    assert merged(written, unwritten) == {"train": Totals(3, 900.0, 400.0), "index": Totals(1, 50.0, 40.0)}
    assert written == {"train": Totals(2, 800.0, 300.0)}
