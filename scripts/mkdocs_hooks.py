"""The docs site's build hooks (mkdocs.yml `hooks:`): the navigation made from the folders of
docs/, so a page added there is in the site without editing mkdocs.yml, and the reference pages'
generated parts (`<!-- generated: NAME -->`, see scripts/docs_reference.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.docs_reference import GENERATED  # noqa: E402

# The sections in the order a reader wants them, and the pages that lead each one; the other pages
# of a section follow in the order of their titles.
SECTIONS = (
    ("Tutorials", "tutorials", ("first-task.md", "worker-python.md", "worker-node.md", "worker-go.md")),
    (
        "How-to guides",
        "how-to",
        (
            "feeds.md",
            "hold-work.md",
            "plan-release.md",
            "fixed-starts.md",
            "docker-compose.md",
            "kubernetes.md",
            "keda.md",
            "tracing.md",
            "security.md",
            "operate.md",
        ),
    ),
    (
        "Reference",
        "reference",
        ("configuration.md", "cli.md", "metrics.md", "grpc-api.md", "worker-protocol.md", "clients.md"),
    ),
    ("Explanation", "explanation", ("concepts.md", "guarantees.md", "holds-and-planning.md", "task-states.md")),
    ("Architecture", "architecture", ("how-it-works.md",)),
)
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def _title(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def navigation(docs: Path) -> list[Any]:
    nav: list[Any] = [{"Home": "index.md"}]
    for title, folder, first in SECTIONS:
        pages = sorted((docs / folder).glob("*.md"))
        lead = [name for name in first if (docs / folder / name).exists()]
        rest = sorted((p for p in pages if p.name not in first), key=_title)
        entries = [f"{folder}/{name}" for name in lead] + [f"{folder}/{p.name}" for p in rest]
        if entries:
            nav.append({title: entries})
    nav.append({"Contributing": ["CONTRIBUTING-DOCS.md"]})
    return nav


def on_config(config: Any) -> Any:
    if not config.get("nav"):
        config["nav"] = navigation(Path(config["docs_dir"]))
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATED:
            raise ValueError(f"{page.file.src_uri}: no generated part named {name!r} (one of {sorted(GENERATED)})")
        return GENERATED[name]()

    return MARKER.sub(generate, markdown)
