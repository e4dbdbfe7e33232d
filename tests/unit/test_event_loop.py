"""Which event loop a lowtide process runs on: uvloop where installed, asyncio's own when asked."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from lowtide import event_loop
from lowtide.errors import ConfigError


def _loop_of(env: dict[str, str]) -> type[asyncio.AbstractEventLoop]:
    loop = event_loop.loop_factory(env)()
    try:
        return type(loop)
    finally:
        loop.close()


def test_uvloop_is_the_default_where_it_is_installed() -> None:
    assert issubclass(_loop_of({}), uvloop.Loop)
    assert issubclass(_loop_of({"LOWTIDE_EVENT_LOOP": "UVLOOP"}), uvloop.Loop)


def test_asyncio_own_loop_when_asked() -> None:
    loop = _loop_of({"LOWTIDE_EVENT_LOOP": "asyncio"})
    assert not issubclass(loop, uvloop.Loop)
    assert issubclass(loop, asyncio.BaseEventLoop)


def test_a_value_that_names_no_loop_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"LOWTIDE_EVENT_LOOP: must be one of uvloop, asyncio, not 'Tokio'"):
        event_loop.loop_factory({"LOWTIDE_EVENT_LOOP": "Tokio"})


def test_run_returns_what_the_coroutine_returns_on_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    async def which() -> bool:
        return isinstance(asyncio.get_running_loop(), uvloop.Loop)

    monkeypatch.delenv("LOWTIDE_EVENT_LOOP", raising=False)
    assert event_loop.run(which()) is True
    monkeypatch.setenv("LOWTIDE_EVENT_LOOP", "asyncio")
    assert event_loop.run(which()) is False
