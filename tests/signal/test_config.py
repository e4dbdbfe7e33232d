"""The signal's configuration: `[signal]`, `[cost]`, `[signals.NAME]` and their environment overrides."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from lowtide.config import load_config
from lowtide.errors import ConfigError
from signal_service.domain import ValueRange
from signal_service.feeds import feed_unit, make_feed
from signal_service.signals import Definition, definitions


def test_defaults() -> None:
    config = load_config(env={})
    assert config.signal.listen == "127.0.0.1:50052"
    assert config.signal.feed == "static"
    assert (config.cost.signal, config.cost.defer_threshold) == ("grid", 400.0)
    assert config.signal.emission_factor == "lifecycle"
    assert config.signal.watttime_signal == "index"
    assert definitions(config, units={"grid": "gCO2/kWh"}) == {
        "grid": Definition("grid", "gCO2/kWh", 400.0, ValueRange(0.0, 2000.0))
    }


def test_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text(
        '[signal]\nfeed = "watttime"\nstale_after = "10m"\nregion = "CAISO_NORTH"\n\n'
        '[cost]\ndefer_threshold = 70.0\n\n[signals.price]\nunit = "EUR/MWh"\nthreshold = 120\n'
    )
    config = load_config(path, env={"LOWTIDE_SIGNAL_LISTEN": "0.0.0.0:7000", "LOWTIDE_COST_SIGNAL": "carbon"})
    assert config.signal.listen == "0.0.0.0:7000"
    assert config.signal.stale_after == timedelta(minutes=10)
    assert config.signal.replay_loop
    assert not load_config(env={"LOWTIDE_SIGNAL_REPLAY_LOOP": "false"}).signal.replay_loop
    assert load_config(env={"LOWTIDE_SIGNAL_EMISSION_FACTOR": "direct"}).signal.emission_factor == "direct"
    moer = load_config(path, env={"LOWTIDE_SIGNAL_WATTTIME_SIGNAL": "moer"})
    assert moer.signal.watttime_signal == "moer"
    assert feed_unit(moer.signal) == "lbs/MWh"
    assert feed_unit(config.signal) == "percentile"
    assert definitions(config, units={"carbon": "percentile", "price": "EUR/MWh"}) == {
        "carbon": Definition("carbon", "percentile", 70.0, ValueRange(0.0, 100.0)),
        "price": Definition("price", "EUR/MWh", 120.0, ValueRange(-1000.0, 10000.0)),
    }


def test_a_signal_s_range_is_its_unit_s_unless_configured(tmp_path: Path) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text(
        '[signals.grid]\nmax = 900\n\n[signals.price]\nunit = "EUR/MWh"\nmin = -2500\n\n'
        '[signals.custom]\nunit = "points"\n'
    )
    found = definitions(load_config(path, env={}), units={"grid": "gCO2/kWh", "price": "EUR/MWh", "custom": "points"})
    assert {name: d.values for name, d in found.items()} == {
        "grid": ValueRange(0.0, 900.0),
        "price": ValueRange(-2500.0, 10000.0),
        "custom": ValueRange(-1e6, 1e6),
    }
    path.write_text("[signals.grid]\nmin = 500\nmax = 100\n")
    with pytest.raises(ConfigError, match=r"\[signals.grid\] min and max: the range 500 to 100 gCO2/kWh is empty"):
        definitions(load_config(path, env={}), units={"grid": "gCO2/kWh"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[signal]\nfeed = "carrier-pigeon"\n', "[signal] feed"),
        ('[signal]\nfeed = "electricitymaps"\n', "[signal] region"),
        ('[signal]\nfeed = "watttime"\n', "[signal] username, password and region"),
        ('[signal]\nfeed = "replay"\nreplay_start = "yesterday"\n', "[signal] replay_start"),
        ('[signal]\nfeed = "replay"\nreplay_speed = 0\n', "[signal] replay_speed"),
        ('[signal]\nfeed = "replay"\nreplay_file = "/nonexistent.csv"\n', "[signal] replay_file"),
    ],
)
def test_a_bad_feed_configuration_is_refused_with_the_key_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "lowtide.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        make_feed(load_config(path, env={}).signal)
    assert message in str(caught.value)
