"""The feeds how-to's quick start (docs/how-to/feeds.md) as a reader runs it: its configuration,
loaded by lowtide's own loader, drives a signal service whose feed is a local server answering as
the Carbon Intensity API does; the value, whether it is high against the page's threshold, and
the forecast reach a subscriber, and the page's held type is held by the scheduler."""

from __future__ import annotations

from pathlib import Path

from lowtide.config import load_config
from lowtide_client import Client, SignalClient
from scheduler_service.server import start_scheduler
from signal_service.server import start_signal_service
from tests.docs.blocks import block_run_by
from tests.helpers import eventually
from tests.signal.grid_server import Answer, grid_api
from tests.signal.test_feeds import uk_entry


async def test_the_quick_start_configuration_follows_the_grid_and_holds_its_type(
    database_url: str, tmp_path: Path
) -> None:
    (block,) = block_run_by("tests/docs/test_feeds_howto.py", "docs/how-to/feeds.md", "toml")
    config_file = tmp_path / "lowtide.toml"
    config_file.write_text(block.text)
    with grid_api() as api:
        api.on("/intensity", Answer({"data": [uk_entry("2026-11-29T23:00Z", 250, 243)]}))
        api.on("/intensity/*", Answer({"data": [uk_entry("2026-11-29T23:30Z", 180, None)]}))
        # Only what a test must change: the API's address, free ports, a quicker poll, and auth
        # off on loopback, as `lowtide up` (the page's `make up`) turns it off by itself.
        env = {
            "LOWTIDE_AUTH": "off",
            "LOWTIDE_SIGNAL_BASE_URL": api.url,
            "LOWTIDE_SIGNAL_LISTEN": "127.0.0.1:0",
            "LOWTIDE_SIGNAL_METRICS_LISTEN": "",
            "LOWTIDE_SIGNAL_REFRESH": "200ms",
            "LOWTIDE_SCHEDULER_LISTEN": "127.0.0.1:0",
            "LOWTIDE_SCHEDULER_METRICS_LISTEN": "",
        }
        config = load_config(config_file, env=env)
        assert config.signal.feed == "uk-carbon-intensity"
        signal = await start_signal_service(config, database_url=database_url)
        try:
            async with SignalClient(signal.target) as signals:

                async def valued() -> bool:
                    return (await signals.get()).value == 243.0

                await eventually(valued, within=20)
                state = await signals.get()
                assert (state.high, state.source) == (True, "uk-carbon-intensity")
                assert [p.value for p in await eventually(signals.forecast, within=20)] == [180.0]
            scheduler_config = load_config(config_file, env={**env, "LOWTIDE_SCHEDULER_SIGNAL_TARGET": signal.target})
            scheduler = await start_scheduler(scheduler_config, database_url=database_url)
            try:
                async with Client(scheduler.target) as client:
                    task = await client.submit("train", b"1")

                    async def held() -> bool:
                        explained = await client.explain(task.id)
                        text = str(explained)
                        return "cost-deferrable" in text and "243" in text and "200" in text

                    await eventually(held, within=20)
                    assert (await client.get(task.id)).attempt == 0
            finally:
                await scheduler.stop(grace=1.0)
        finally:
            await signal.stop()
