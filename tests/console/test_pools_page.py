"""The pools page's figures say what they mean: a pool whose work needs more workers than its
max_workers (the default 1 of a pool not configured) says why, rather than "8 of 1"."""

from __future__ import annotations

import asyncio
import re

import httpx

from lowtide_client import Client
from tests.console.conftest import Stack
from tests.faults.support import RawWorker
from tests.helpers import eventually


async def test_desired_workers_past_max_workers_is_explained(open_stack: Stack) -> None:
    # One worker of one slot that never reports: 8 tasks of its type need 8 such workers.
    worker = RawWorker(open_stack.scheduler, "one-slot", slots=1)
    try:
        await worker.connect()
        async with Client(open_stack.scheduler) as client:
            for n in range(8):
                await client.submit("count", str(n).encode())

        async def desired() -> str:
            """The pool's desired-workers cell, once it counts all 8 tasks."""
            page = await asyncio.to_thread(httpx.get, f"{open_stack.url}/live/pools", timeout=10)
            found = re.search(r'<tr data-pool="default">.*?</tr>', page.text, re.S)
            cell = re.findall(r"<td[^>]*>(.*?)</td>", found.group(0), re.S)[-1] if found else ""
            return cell if cell.strip().startswith("8") else ""

        shown = " ".join(re.sub(r"<[^>]+>", "", await eventually(desired, within=30, interval=0.5)).split())
        assert not shown.startswith("8 of 1")
        assert (
            "what its work needs, past its max_workers of 1: max_workers sizes its reservations and caps nothing "
            "(1 is the default of a pool with no [pools.default] max_workers)"
        ) in shown
    finally:
        await worker.close()
