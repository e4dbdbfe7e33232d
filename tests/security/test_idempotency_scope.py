"""Idempotency keys belong to their submitter: two tokens of two submitters using one key each get
their own task, and a repeat by either returns that submitter's own first task."""

from __future__ import annotations

from dataclasses import replace

from lowtide.auth import hash_token
from lowtide.config import TokenEntry
from lowtide_client import Client, task_spec
from scheduler_service.server import start_scheduler
from tests.conftest import make_config
from tests.security.conftest import AUTH, TOKENS

OTHER = "s-secret-other"


async def test_two_submitters_with_one_key_each_get_their_own_task(database_url: str) -> None:
    auth = replace(AUTH, tokens=(*AUTH.tokens, TokenEntry("other-submitter", "submitter", hash_token(OTHER))))
    scheduler = await start_scheduler(replace(make_config(), auth=auth), database_url=database_url)
    try:
        async with (
            Client(scheduler.target, token=TOKENS["submitter"]) as mine,
            Client(scheduler.target, token=OTHER) as theirs,
            Client(scheduler.target, token=TOKENS["admin"]) as admin,
        ):
            my_task = await mine.submit("echo", b"mine", idempotency_key="order-42")
            their_task = await theirs.submit("echo", b"theirs", idempotency_key="order-42")
            my_again = await mine.submit("echo", b"mine again", idempotency_key="order-42")
            [their_again] = await theirs.submit_many([task_spec("echo", b"theirs again", idempotency_key="order-42")])
            listed = await admin.list(page_size=100)
    finally:
        await scheduler.stop(grace=0.5)
    # The other submitter's key neither returned my task nor kept theirs from being created.
    assert their_task.id != my_task.id and their_task.payload == b"theirs"
    # A repeat is still idempotent, within each submitter.
    assert (my_again.id, my_again.payload) == (my_task.id, b"mine")
    assert (their_again.id, their_again.created) == (their_task.id, False)
    assert sorted(t.id for t in listed.tasks) == sorted([my_task.id, their_task.id])
