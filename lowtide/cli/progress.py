"""A progress bar on stderr for long commands (`task submit --count N`): drawn only when stderr
is a terminal, so that a pipe or a log file gets nothing but the command's own output."""

from __future__ import annotations

import shutil
import sys
from typing import TextIO


class Progress:
    def __init__(self, total: int, what: str, stream: TextIO | None = None) -> None:
        self._total = total
        self._what = what
        self._stream = stream if stream is not None else sys.stderr
        self._shown = self._stream.isatty()
        self.done = 0

    def advance(self, count: int) -> None:
        self.done += count
        if not self._shown:
            return
        counter = f" {self.done}/{self._total} {self._what}"
        width = max(10, min(40, shutil.get_terminal_size().columns - len(counter) - 3))
        filled = width * self.done // self._total
        self._stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}]{counter}")
        self._stream.flush()

    def end(self) -> None:
        if self._shown and self.done:
            self._stream.write("\n")
            self._stream.flush()
