"""The dispatcher's claims run on connections of their own whose statements keep PostgreSQL's
generic plan (lowtide.db.connector); every other statement keeps custom plans, which its optional
filters need."""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.db import Database


@dataclass(frozen=True, slots=True)
class Setting:
    plan_cache_mode: str


async def test_planned_statements_keep_generic_plans_and_the_rest_custom_ones(database_url: str) -> None:
    db = Database(database_url, min_size=1, max_size=2, planned_max=1)
    await db.open()
    try:
        show = "SELECT current_setting('plan_cache_mode') AS plan_cache_mode"
        assert await db.fetch_as(Setting, show, planned=True) == [Setting("force_generic_plan")]
        async with db.transaction(planned=True) as tx:
            assert await tx.fetch_one_as(Setting, show) == Setting("force_generic_plan")
        assert await db.fetch_as(Setting, show) == [Setting("auto")]
        async with db.transaction() as tx:
            assert await tx.fetch_one_as(Setting, show) == Setting("auto")
    finally:
        await db.close()
