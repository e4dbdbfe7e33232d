"""Shared fixtures: a real PostgreSQL (LOWTIDE_TEST_DATABASE_URL, or an embedded server started
for the session), a migrated template database built once, and a fresh copy of it per test."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import hypothesis
import psycopg
import pytest
from psycopg import conninfo

from lowtide.config import AuthConfig, Config, SchedulerConfig
from lowtide.db import apply_migrations
from scheduler_service.server import Scheduler, start_scheduler

# The suite shares two cores with the services it starts: a property's example may take far longer
# than hypothesis's default 200 ms deadline for reasons that have nothing to do with the property.
# Speed is measured by `make bench`, never by a test.
hypothesis.settings.register_profile("lowtide", deadline=None)
hypothesis.settings.load_profile("lowtide")

# Auth off, as `lowtide up` runs it on loopback: for fixtures built here and, through the
# environment, for the services tests start as processes (`lowtide scheduler serve`, ...).
NO_AUTH = AuthConfig(enabled=False)
os.environ.setdefault("LOWTIDE_AUTH", "off")


def with_dbname(url: str, dbname: str) -> str:
    return conninfo.make_conninfo(url, dbname=dbname)


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = os.environ.get("LOWTIDE_TEST_DATABASE_URL")
    if url:
        return url
    from lowtide.db.embedded import start_embedded

    return start_embedded(Path(tmp_path_factory.mktemp("embedded-pg")))


@pytest.fixture
def embedded_data_dir() -> Iterator[Path]:
    """A folder for a test's own embedded PostgreSQL, outside pytest's temporary tree, removed
    after the test. Run as root, the server runs as another user, which must traverse every folder
    above its data; any pytest session that starts on the machine meanwhile takes group and other
    access off pytest's root folder (`pytest-of-USER`), and the server could no longer reach its
    data (a fault test failed so, once, beside another session)."""
    folder = Path(tempfile.mkdtemp(prefix="lowtide-test-pg-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url, autocommit=True)


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    name = f"lowtide_tpl_{uuid.uuid4().hex[:10]}"
    with _admin(pg_server_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    import asyncio

    asyncio.run(apply_migrations(with_dbname(pg_server_url, name)))
    yield name
    with _admin(pg_server_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = f"lowtide_t_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield with_dbname(pg_server_url, name)
    with _admin(pg_server_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def make_config(**scheduler: object) -> Config:
    """A config with short intervals, so tests of time-driven behaviour stay quick."""
    base = SchedulerConfig(
        listen="127.0.0.1:0",
        heartbeat_interval=timedelta(milliseconds=300),
        lease_timeout=timedelta(seconds=2),
        maintenance_interval=timedelta(milliseconds=100),
        leader_lease=timedelta(seconds=2),
        metrics_listen="127.0.0.1:0",
        metrics_interval=timedelta(milliseconds=200),
    )
    # Auth is on by default; these tests are about scheduling, on loopback, so it is off here
    # explicitly (tests/security turns it on).
    return Config(scheduler=replace(base, **scheduler), auth=NO_AUTH)  # type: ignore[arg-type]


@pytest.fixture
async def scheduler(database_url: str) -> AsyncIterator[Scheduler]:
    running = await start_scheduler(make_config(), database_url=database_url)
    yield running
    await running.stop(grace=1.0)
