"""Named queries: each `.sql` file holds blocks that start with `-- name --` and one comment line
saying what the query does, as in Procrastinate's queries.sql. Loaded once into a dict.
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z0-9_]+) --\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        sql = body.strip()
        if not sql:
            raise ValueError(f"query {name!r} is empty")
        queries[name] = sql
    return queries


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    return parse_queries(resources.files(package).joinpath(filename).read_text())
