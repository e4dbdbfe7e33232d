"""What WaitTask's waiters need: which tasks finished, and telling the other replicas."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_service.rows.waits import FinishedTask
from scheduler_service.store.base import Q, StoreBase

# A NOTIFY payload must stay under 8,000 bytes: ids are sent in chunks of at most this many characters.
MAX_PAYLOAD = 7900


class WaitStore(StoreBase):
    async def finished_among(self, ids: Sequence[int]) -> set[int]:
        rows = await self.db.fetch_as(FinishedTask, Q["finished_among"], {"ids": list(ids)})
        return {row.id for row in rows}

    async def notify_finished(self, ids: Sequence[int]) -> None:
        """Announces finished tasks to every replica (this one included), in as few notifications
        as fit."""
        chunk: list[str] = []
        size = 0
        for task_id in ids:
            text = str(task_id)
            if chunk and size + len(text) + 1 > MAX_PAYLOAD:
                await self.db.execute(Q["notify_finished"], {"payload": ",".join(chunk)})
                chunk, size = [], 0
            chunk.append(text)
            size += len(text) + 1
        if chunk:
            await self.db.execute(Q["notify_finished"], {"payload": ",".join(chunk)})
