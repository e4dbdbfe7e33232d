"""The hand-written parts of the reference against the code: every span the services and the
worker libraries make, with every `lowtide.*` attribute they give it, is in the spans table of
docs/reference/metrics.md (its metrics table is checked against a live scrape by
tests/cost/test_task_histograms.py)."""

from __future__ import annotations

import re

from tests.docs.blocks import ROOT

TRACING = (
    "scheduler_service/observe/tracing.py",
    "clients/python/lowtide_client/_tracing.py",
    "clients/node/lib/tracing.js",
)


def spans_table() -> dict[str, str]:
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    section = page.split("\n## Spans\n", 1)[1]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `([\w./]+)`.*$", section, re.M)}


def test_every_span_and_attribute_the_code_makes_is_in_the_reference() -> None:
    table = spans_table()
    for path in TRACING:
        source = (ROOT / path).read_text()
        names = set(re.findall(r"""["'](task\.[a-z]+|/lowtide\.v1\.[A-Za-z]+/[A-Za-z]+)["']""", source))
        assert names, f"{path} makes no task span any more: update this test"
        for name in names:
            assert name in table, f"{path} makes span {name}, which docs/reference/metrics.md does not list"
        for attribute in set(re.findall(r"""["'](lowtide\.[a-z_.]+)["']""", source)):
            rows = [row for span, row in table.items() if span in names and f"`{attribute}`" in row]
            assert rows, f"{path}: attribute {attribute} of its spans is not in docs/reference/metrics.md"
