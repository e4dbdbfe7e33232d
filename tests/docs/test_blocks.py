"""Every code block of the docs and the README is run by a test or marked as not run, as
docs/CONTRIBUTING-DOCS.md says: what a reader copies either works or says it is not checked."""

from __future__ import annotations

import re

from tests.docs.blocks import ROOT, all_blocks

SHELL = {"sh", "bash", "shell"}
FREE = {"text", "mermaid", "console"}
RUN_BY = re.compile(r"^<!-- run by (tests/[\w/.-]+\.py) -->$")


def test_every_block_is_run_by_a_test_that_reads_it_or_marked_as_not_run() -> None:
    wrong: list[str] = []
    for block in all_blocks():
        page = str(block.path.relative_to(ROOT))
        run_by = RUN_BY.match(block.mark)
        if run_by:
            test = ROOT / run_by.group(1)
            if not test.is_file():
                wrong.append(f"{block.where}: marked as run by {run_by.group(1)}, which does not exist")
            elif page not in test.read_text():
                wrong.append(f"{block.where}: {run_by.group(1)} does not read {page}")
        elif block.language == "toml" or block.language in FREE:
            continue  # toml: loaded by tests/unit/test_docs_toml.py
        elif block.language in SHELL:
            wrong.append(f"{block.where}: a ```{block.language} block must be run by a test; fence it as ```console")
        elif block.mark != "<!-- not run -->":
            wrong.append(f"{block.where}: a ```{block.language or 'plain'} block is neither run by a test nor marked")
    assert not wrong, "\n".join(wrong)


def test_a_block_with_no_mark_is_found() -> None:
    # The rule above must see an unmarked block: a page of the docs has at least one of each kind.
    languages = {block.language for block in all_blocks()}
    assert {"toml", "console", "python"} <= languages, languages
