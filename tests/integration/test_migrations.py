"""Migrations: applied at once by several starters (tasks and processes) on an empty database,
each version exactly once; and the migrated schema holds every table and column the
scheduler's queries name."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import psycopg
import pytest

from lowtide.db import apply_migrations, load_queries
from lowtide.db.migrations import available_migrations
from tests.conftest import with_dbname
from tests.helpers import eventually

REPO = Path(__file__).resolve().parents[2]
_PLACEHOLDER = re.compile(r"%\(([a-z_][a-z0-9_]*)\)s")


@pytest.fixture
def empty_database(pg_server_url: str) -> Iterator[str]:
    """A brand-new database with nothing in it (not even the lowtide schema)."""
    name = f"lowtide_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(pg_server_url, name)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def recorded_versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version FROM lowtide.schema_migrations ORDER BY version").fetchall()
    return [int(row[0]) for row in rows]


def all_versions() -> list[int]:
    return [m.version for m in available_migrations()]


async def test_concurrent_starters_apply_each_migration_once(empty_database: str) -> None:
    results = await asyncio.gather(*(apply_migrations(empty_database) for _ in range(4)))
    # Between them the four calls applied every migration, each one exactly once.
    assert sorted(v for applied in results for v in applied) == all_versions()
    assert recorded_versions(empty_database) == all_versions()
    # And a later start finds nothing left to do.
    assert await apply_migrations(empty_database) == []


async def test_concurrent_processes_apply_each_migration_once(empty_database: str) -> None:
    code = (
        "import asyncio, json, sys; from lowtide.db import apply_migrations; "
        "print(json.dumps(asyncio.run(apply_migrations(sys.argv[1]))))"
    )
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            empty_database,
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in processes)), 60)
    finally:
        for p in processes:
            if p.returncode is None:
                p.kill()
                await p.wait()
    for p, (_, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 0, err.decode(errors="replace")
    applied = sorted(v for out, _ in outputs for v in json.loads(out))
    assert applied == all_versions()
    assert recorded_versions(empty_database) == all_versions()


def numbered(sql: str) -> tuple[str, int]:
    """psycopg's `%(name)s` placeholders as PostgreSQL's `$n` (the same name, the same number);
    comment lines are dropped first, so a name only mentioned in a comment is not counted."""
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match[1], len(numbers) + 1)}"

    return _PLACEHOLDER.sub(number, body), len(numbers)


# Every named query of both services: a renamed column fails here rather than in production.
QUERY_FILES = tuple(
    (package, entry.name)
    for package in ("scheduler_service.sql", "signal_service.sql")
    for entry in sorted(resources.files(package).iterdir(), key=lambda entry: entry.name)
    if entry.name.endswith(".sql")
)
QUERIES = {
    f"{package}/{filename}:{name}": sql
    for package, filename in QUERY_FILES
    for name, sql in load_queries(package, filename).items()
}


@pytest.fixture(scope="module")
def migrated_database(pg_server_url: str, template_db: str) -> Iterator[str]:
    """One migrated database for every query below: preparing a statement changes nothing."""
    name = f"lowtide_q_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield with_dbname(pg_server_url, name)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_query_files_have_queries() -> None:
    names = {name.rsplit(":", 1)[1] for name in QUERIES}
    assert {"insert_tasks", "claim_tasks", "finish_attempts", "get_task"} <= names
    assert all(any(key.startswith(f"{p}/{f}:") for key in QUERIES) for p, f in QUERY_FILES)


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_every_query_prepares_against_the_migrated_schema(migrated_database: str, query: str) -> None:
    sql, _ = numbered(QUERIES[query])
    assert "%(" not in sql, f"{query}: a placeholder that is not %(name)s"
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        try:
            conn.execute(f"PREPARE q AS {sql}")
        except psycopg.Error as error:
            pytest.fail(f"query {query!r} does not fit the migrated schema: {error}")
        conn.execute("DEALLOCATE q")


def _as_before_version(url: str, version: int, index: str) -> None:
    """The database as an earlier release left it: without `index` and migration `version`."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP INDEX lowtide.{index}")
        conn.execute("DELETE FROM lowtide.schema_migrations WHERE version = %s", (version,))


def _index_valid(url: str, index: str) -> bool | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
            (index,),
        ).fetchone()
    return None if row is None else bool(row[0])


_TASK = (
    "INSERT INTO lowtide.tasks (queue, kind, activity_type, payload, max_attempts, initial_backoff_ms, "
    "backoff_coefficient, max_backoff_ms) VALUES ('default', 'activity', 'work', '', 3, 1000, 2.0, 60000)"
)


async def test_an_upgrade_builds_its_indexes_without_holding_off_writes(empty_database: str) -> None:
    """A rolling upgrade: the replicas still running keep writing while the next one migrates.
    With a transaction open, the index build waits for it; a plain CREATE INDEX would hold every
    later write behind it meanwhile, a concurrent one does not."""
    await apply_migrations(empty_database)
    _as_before_version(empty_database, 19, "tasks_finished_at")
    with psycopg.connect(empty_database) as open_writer:
        open_writer.execute(_TASK)  # a claim or a completion in flight, not committed yet
        migrating = asyncio.create_task(apply_migrations(empty_database))

        async def build_waits() -> bool:
            with psycopg.connect(empty_database) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX%%' AND wait_event IS NOT NULL"
                ).fetchone()
            return bool(row and row[0])

        await eventually(build_waits, within=30)
        with psycopg.connect(empty_database, autocommit=True) as writer:
            writer.execute("SET lock_timeout = '3s'")
            writer.execute(_TASK)
            writer.execute(
                "UPDATE lowtide.tasks SET state = 'running', attempt = 1 WHERE id = (SELECT max(id) FROM lowtide.tasks)"
            )
        assert not migrating.done()
        open_writer.commit()
        assert await asyncio.wait_for(migrating, 30) == [19]
    assert _index_valid(empty_database, "tasks_finished_at") is True


async def test_an_index_build_cut_off_midway_is_built_again(empty_database: str) -> None:
    """A start stopped during a concurrent build leaves the index invalid, which IF NOT EXISTS
    would take for built: the next start drops it and builds it whole."""
    await apply_migrations(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'lowtide.tasks_finished_at'::regclass")
        conn.execute("DELETE FROM lowtide.schema_migrations WHERE version = 19")
    assert _index_valid(empty_database, "tasks_finished_at") is False
    assert await apply_migrations(empty_database) == [19]
    assert _index_valid(empty_database, "tasks_finished_at") is True


async def test_the_carbon_totals_start_from_the_tasks_kept(empty_database: str) -> None:
    """Upgrading to the kept carbon totals loses no figure: they start from the tasks already
    dispatched with a known signal, per type."""
    await apply_migrations(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("DROP TABLE lowtide.carbon_totals")
        conn.execute("DELETE FROM lowtide.schema_migrations WHERE version = 21")
        for at_submit, at_dispatch in ((500, 100), (300, 200), (None, 100)):
            conn.execute(_TASK)
            conn.execute(
                "UPDATE lowtide.tasks SET signal_at_submit = %s, signal_at_dispatch = %s"
                " WHERE id = (SELECT max(id) FROM lowtide.tasks)",
                (at_submit, at_dispatch),
            )
    assert await apply_migrations(empty_database) == [21]
    with psycopg.connect(empty_database) as conn:
        rows = conn.execute("SELECT activity_type, tasks, sum_at_submit, sum_at_dispatch FROM lowtide.carbon_totals")
        assert rows.fetchall() == [("work", 2, 800.0, 300.0)]
