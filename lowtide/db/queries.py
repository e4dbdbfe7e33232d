"""Named queries: each `.sql` file holds blocks that start with `-- name --` and one comment line
saying what the query does, as in Procrastinate's queries.sql. Loaded once into a dict.

A block whose name starts with `_` is a fragment, not a query: text that several queries share
(what a claim sets, say), written once and put in place of `{{_name}}` when the file is loaded.
A package's files share their fragments: a query of one file may use a fragment of another.

A query is kept without its comment lines, indentation and runs of blanks (line breaks stay, so a
comment at the end of a line still ends there): psycopg parses a statement's text once and
remembers it only when it is at most 4 KB, and a longer one (the insert that answers SubmitTask, the
claim of a group of several types) was parsed again on every execution.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

_HEADER = re.compile(r"^-- ([a-z0-9_]+) --\s*$", re.MULTILINE)
_FRAGMENT = re.compile(r"\{\{(_[a-z0-9_]+)\}\}")
_COMMENT_LINE = re.compile(r"^\s*--.*\n", re.MULTILINE)
_INDENT = re.compile(r"^[ \t]+", re.MULTILINE)
_BLANKS = re.compile(r"[ \t]{2,}")
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _compact(sql: str) -> str:
    """The statement without comment lines, indentation or runs of blanks (none of the queries
    has a string literal they would change)."""
    return _BLANKS.sub(" ", _INDENT.sub("", _COMMENT_LINE.sub("", sql + "\n"))).strip()


def _blocks(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    blocks: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"query {name!r} is defined twice")
        sql = body.strip()
        if not sql:
            raise ValueError(f"query {name!r} is empty")
        blocks[name] = sql
    return blocks


def _resolve(queries: dict[str, str], every: dict[str, str]) -> dict[str, str]:
    """The queries (fragments left out) with each `{{_name}}` replaced by that fragment of `every`."""
    # A fragment goes in without its comment lines (the query says what it does), and with the
    # fragments it uses in place.
    fragments = {name: _compact(sql) for name, sql in every.items() if name[0] == "_"}

    def fill(sql: str, using: tuple[str, ...]) -> str:
        def fragment(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in fragments:
                raise ValueError(f"no fragment {name!r} (a block named -- {name} --)")
            if name in using:
                raise ValueError(f"fragment {name!r} uses itself: {' -> '.join((*using, name))}")
            return fill(fragments[name], (*using, name))

        return _FRAGMENT.sub(fragment, sql)

    return {name: _compact(fill(sql, ())) for name, sql in queries.items() if name[0] != "_"}


def parse_queries(text: str) -> dict[str, str]:
    blocks = _blocks(text)
    return _resolve(blocks, blocks)


def load_queries(package: str, filename: str | None = None) -> dict[str, str]:
    """The queries of one `.sql` file of the package, or of all its files (no filename): a file per
    concern, its fragments shared with the package's other files."""
    files = resources.files(package)
    by_file = {entry.name: _blocks(entry.read_text()) for entry in files.iterdir() if entry.name.endswith(".sql")}
    every: dict[str, str] = {}
    for name, blocks in sorted(by_file.items()):
        twice = every.keys() & blocks.keys()
        if twice:
            raise ValueError(f"{package}/{name}: {sorted(twice)} defined in another file too")
        every |= blocks
    if filename is None:
        return _resolve(every, every)
    if filename not in by_file:
        raise FileNotFoundError(f"no {filename} in {package}")
    return _resolve(by_file[filename], every)


@dataclass(frozen=True)
class Positional:
    """A query in PostgreSQL's own placeholders ($1, $2, ...), with the name each stands for: what
    psycopg's raw cursor sends as it is. psycopg parses a statement written with named placeholders
    on every execution once its text is over 4 KB (about 0.2 ms for 5 KB); this one is parsed once,
    when it is made."""

    text: str
    names: tuple[str, ...]

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        return [params[name] for name in self.names]


def positional(sql: str) -> Positional:
    """The query with each `%(name)s` made `$n`, the same name the same number."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    text = _PLACEHOLDER.sub(number, sql)
    if "%" in text:
        raise ValueError(f"only %(name)s placeholders can be made positional: {text[text.index('%') :][:40]!r}")
    return Positional(text, tuple(names))
