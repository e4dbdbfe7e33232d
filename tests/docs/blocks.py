"""The fenced code blocks of README.md and docs/**/*.md, with the mark on the line before each
(docs/CONTRIBUTING-DOCS.md says what the marks mean)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    language: str
    mark: str  # the HTML comment on the line before the fence, or ""
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, language = opening.groups()
        before = lines[index - 1].strip() if index else ""
        mark = before if before.startswith("<!--") and before.endswith("-->") else ""
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[index + 1 : end]]
        yield Block(path, index + 1, language, mark, "\n".join(body) + "\n")
        index = end + 1


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in blocks(path)]


def block_run_by(test: str, page: str, language: str) -> list[Block]:
    """The blocks of one page in one language that are marked as run by `test`."""
    return [
        block for block in blocks(ROOT / page) if block.language == language and block.mark == f"<!-- run by {test} -->"
    ]
