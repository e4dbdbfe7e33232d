"""The docs site builds strictly (no broken link or anchor), and its generated reference names
every configuration key, every command and flag, and every RPC of the code it is made from."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lowtide.config import schema
from tests.docs.blocks import ROOT

README_MAX_LINES = 200


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = build(ROOT / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr
    return out


def text_of(site: Path, page: str) -> str:
    html = (site / page / "index.html").read_text()
    return re.sub(r"<[^>]+>", "", html)


def test_the_configuration_reference_names_every_key_with_its_default(site: Path) -> None:
    page = text_of(site, "reference/configuration")
    for section, cls in schema.SECTIONS.items():
        assert f"[{section}]" in page, section
        for spec in dataclasses.fields(cls):
            assert re.search(rf"^{re.escape(spec.name)}\s*$", page, re.M), f"[{section}] {spec.name}"
    for cls in (schema.TypeConfig, schema.PoolConfig, schema.QueueConfig, schema.AdaptiveConcurrencyConfig):
        for spec in dataclasses.fields(cls):
            assert re.search(rf"^{re.escape(spec.name)}\s*$", page, re.M), f"{cls.__name__}.{spec.name}"
    # A default and a range as the schema declares them.
    assert re.search(r"lease_timeout\s+duration\s+10s\s+1s to 1h", page), "lease_timeout's row"


def test_the_cli_reference_names_every_command_and_flag(site: Path) -> None:
    from lowtide.cli import _parser

    page = text_of(site, "reference/cli")
    missing: list[str] = []

    def walk(parser: object, path: list[str]) -> None:
        import argparse

        assert isinstance(parser, argparse.ArgumentParser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*path, name])
            elif action.option_strings and action.help != argparse.SUPPRESS:
                for option in action.option_strings:
                    if option not in ("-h", "--help") and option not in page:
                        missing.append(f"{' '.join(path)} {option}")
        if len(path) > 1 and " ".join(path) not in page:
            missing.append(" ".join(path))

    walk(_parser(), ["lowtide"])
    assert not missing, missing


def test_the_grpc_reference_names_every_rpc_and_its_comment(site: Path) -> None:
    page = text_of(site, "reference/grpc-api")
    protos = "\n".join(p.read_text() for p in (ROOT / "protos").rglob("*.proto"))
    rpcs = re.findall(r"^\s*rpc (\w+)\(", protos, re.M)
    assert rpcs and all(rpc in page for rpc in rpcs), [rpc for rpc in rpcs if rpc not in page]
    # The leading comment of a field, as written in the proto.
    assert "Higher runs first; FIFO within one priority." in page


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        (ROOT / "mkdocs.yml").read_text().replace("scripts/mkdocs_hooks.py", str(ROOT / "scripts/mkdocs_hooks.py"))
    )
    page = docs / "index.md"
    page.write_text(page.read_text() + "\nSee [nowhere](reference/configuration.md#no-such-heading).\n")
    built = build(config, tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-heading" in built.stderr


def test_every_link_of_the_readme_leads_somewhere() -> None:
    # GitHub shows the README, not the site: its relative links must name files that exist.
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into the docs"
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    # What a reader sees: the marks for the docs' tests (HTML comments) are not shown.
    readme = re.sub(r"<!--.*?-->", "", readme)
    # No issue numbers, no test names, no dated benchmark runs: those live in the docs.
    assert not re.search(r"\bissue \d+|#\d+\b", readme, re.I)
    assert not re.search(r"\btest_\w+", readme)
    assert not re.search(r"\b\d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\w* 20\d\d", readme)


def test_the_client_libraries_readmes_are_in_the_reference(site: Path) -> None:
    page = text_of(site, "reference/clients")
    for folder in ("python", "node", "go"):
        readme = (ROOT / "clients" / folder / "README.md").read_text()
        title = readme.splitlines()[0].lstrip("# ").strip()
        assert title in page, folder
