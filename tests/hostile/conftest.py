"""Both services started once for the hostile suite (as real processes, auth on), on a database of
their own: every attack is judged on services that have already taken the ones before it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import with_dbname
from tests.hostile.canary import Services, services


@pytest.fixture(scope="module")
def hostile_services(
    pg_server_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Services]:
    name = f"lowtide_h_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        with services(with_dbname(pg_server_url, name), tmp_path_factory.mktemp("hostile")) as running:
            yield running
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
