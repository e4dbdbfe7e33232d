"""`lowtide up` runs its services with one shared stdout: each line they print must arrive whole,
even when the output is unbuffered (PYTHONUNBUFFERED, as in CI and many containers)."""

from __future__ import annotations

import os
import subprocess
import sys

LINES = 2_000

# Each process prints LINES lines, as fast as it can, to the stdout it shares with the other.
SPEAKER = """
import sys
from lowtide.output import print_line
name, lines = sys.argv[1], int(sys.argv[2])
for i in range(lines):
    print_line(f"lowtide {name} listening on 127.0.0.1:{i}")
"""


def test_two_processes_printing_to_one_pipe_never_split_a_line() -> None:
    read, write = os.pipe()
    speakers = [
        subprocess.Popen([sys.executable, "-u", "-c", SPEAKER, name, str(LINES)], stdout=write)
        for name in ("signal-service", "scheduler")
    ]
    os.close(write)
    with open(read, encoding="utf-8") as out:
        printed = out.read().splitlines()
    for speaker in speakers:
        assert speaker.wait(timeout=60) == 0
    expected = {
        f"lowtide {name} listening on 127.0.0.1:{i}" for name in ("signal-service", "scheduler") for i in range(LINES)
    }
    torn = [line for line in printed if line not in expected]
    assert not torn, f"{len(torn)} lines were torn, e.g. {torn[:3]}"
    assert len(printed) == 2 * LINES
