"""Every ```toml block in README.md and docs/**/*.md loads with lowtide's own config loader, as a
reader would save it to a file and pass it to `--config`: a sample that the loader refuses (an
unknown key, a duration spelled in a way it does not read) fails here, naming the file and line.

A block that is deliberately a fragment (a few keys out of their table, to be pasted into a
larger file) is marked with an HTML comment on the line right before its fence:

    <!-- toml: fragment -->
    ```toml
    retention = "7d"
    ```

Such a block is left out. Nothing else is: a block that cannot stand alone without that mark
fails the test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lowtide.config import load_config

ROOT = Path(__file__).resolve().parents[2]
FRAGMENT = "<!-- toml: fragment -->"
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*toml\s*$")


def toml_blocks(path: Path) -> list[tuple[int, str]]:
    """(line number of the opening fence, text) of each toml block of a markdown file that is not
    marked as a fragment."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[tuple[int, str]] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = opening.groups()
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][len(indent) :] if lines[index].startswith(indent) else lines[index])
            index += 1
        index += 1
        previous = lines[start - 1].strip() if start > 0 else ""
        if previous != FRAGMENT:
            blocks.append((start + 1, "\n".join(body) + "\n"))
    return blocks


def documents() -> list[Path]:
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(docs.rglob("*.md"))]


BLOCKS = [
    pytest.param(path, line, text, id=f"{path.relative_to(ROOT)}:{line}")
    for path in documents()
    for line, text in toml_blocks(path)
]


def test_the_documents_have_toml_samples_to_check() -> None:
    assert BLOCKS, "no ```toml block found in README.md or docs/: is the fence spelled ```toml?"


@pytest.mark.parametrize(("path", "line", "text"), BLOCKS)
def test_every_toml_block_loads_with_the_config_loader(path: Path, line: int, text: str, tmp_path: Path) -> None:
    sample = tmp_path / "lowtide.toml"
    sample.write_text(text, encoding="utf-8")
    # No environment: the block alone decides what loads.
    load_config(sample, env={})


def test_a_block_marked_as_a_fragment_is_left_out_and_only_that_one(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        f'Paste this into [scheduler]:\n\n{FRAGMENT}\n```toml\nretention = "7d"\n```\n\n'
        'A whole file:\n\n```toml\n[scheduler]\nretention = "7d"\n```\n',
        encoding="utf-8",
    )
    assert toml_blocks(page) == [(10, '[scheduler]\nretention = "7d"\n')]
