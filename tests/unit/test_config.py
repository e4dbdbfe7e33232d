"""Configuration: TOML, environment overrides, and clear errors."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from lowtide.config import load_config
from lowtide.errors import ConfigError


def test_toml_values_and_environment_overrides(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text('[scheduler]\npoll_interval = "250ms"\n\n[types.train]\nmax_concurrency = 2\n')
    config = load_config(path, env={"LOWTIDE_SCHEDULER_LISTEN": "0.0.0.0:6000", "LOWTIDE_DATABASE_URL": "pg://x"})
    assert config.scheduler.poll_interval == timedelta(milliseconds=250)
    assert config.scheduler.listen == "0.0.0.0:6000"
    assert config.database.url == "pg://x"
    assert config.types["train"].max_concurrency == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[scheduler]\npoll_interval = "soon"\n', "[scheduler] poll_interval"),
        ("[scheduler]\npoll = 1\n", "unknown key(s) poll"),
        ("[nope]\n", "unknown section(s) nope"),
        ("[types.x]\nmax_concurrency = 0\n", "[types.x] max_concurrency"),
    ],
)
def test_bad_config_is_refused_with_the_key_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert message in str(caught.value)
