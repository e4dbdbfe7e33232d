"""Figures noted on a hot path in memory and written to the database in one statement per window:
the first note of a window waits `window` seconds for others to join it. A write that finds the
database unavailable keeps its batch for the next window. Heartbeat deadlines (fleet/heartbeats.py) and
the carbon totals (observe/carbon_totals.py) are written this way."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from lowtide.errors import DatabaseUnavailable

Batch = TypeVar("Batch")


class BatchedWrites(ABC, Generic[Batch]):
    def __init__(self, window: float) -> None:
        self._window = window
        self._noted = asyncio.Event()
        # Statements run (one per window with anything noted).
        self.writes = 0

    def noted(self) -> None:
        """Something was noted: it is written within the window."""
        self._noted.set()

    async def run(self) -> None:
        while True:
            await self._noted.wait()
            await asyncio.sleep(self._window)
            self._noted.clear()
            await self.flush()

    async def flush(self) -> None:
        """Writes everything noted so far, in one statement."""
        batch = self._take()
        if batch is None:
            return
        try:
            self.writes += 1
            await self._write(batch)
        except DatabaseUnavailable as error:
            self._keep(batch, error)
            self._noted.set()

    @abstractmethod
    def _take(self) -> Batch | None:
        """Everything noted so far (None: nothing), forgotten here."""

    @abstractmethod
    async def _write(self, batch: Batch) -> None:
        """Writes the batch in one statement."""

    @abstractmethod
    def _keep(self, batch: Batch, error: DatabaseUnavailable) -> None:
        """The write failed: the batch goes back to be written with the next window's notes."""
