"""One soak: the stack up, the load and the faults for the duration, then every fault undone,
the work drained, and every invariant judged on what was recorded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import time
from collections import Counter
from signal import Signals

from lowtide.db import apply_migrations
from lowtide.health import check_health
from soak import collect, go, invariants
from soak.facts import Fault, Violation
from soak.load import Load
from soak.plan import PlannedFault, plan_faults
from soak.relay import Relay
from soak.report import summary
from soak.stack import REPO, Postgres, Proc, Settings, Soak, lowtide

log = logging.getLogger("soak")

THRESHOLD = 215.0  # about the bundled GB 2020 trace's median: held about half the time
LEASE = 10.0
# A running task with no live attempt for this long is stranded (beyond a frozen replica's or
# worker's outage, a lease and the maintenance that ends a lost attempt).
STRANDED_AFTER = 60.0
# How long the end waits for the work to drain once the faults and the load have stopped.
DRAIN_WITHIN = 240.0
RSS_LIMIT = 1 << 30
FD_LIMIT = 1000

CONFIG = f"""
[scheduler]
lease_timeout = "{LEASE:g}s"
metrics_listen = ""
[signal]
feed = "replay"
replay_speed = 5760
refresh = "1s"
stale_after = "30s"
metrics_listen = ""
[cost]
defer_threshold = {THRESHOLD:g}
deferrable_activities = ["defer"]
[pools.fixed]
max_workers = 2
reservable_fraction = 1.0
[console]
listen = ""
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serving(target: str, proc: Proc, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not (await check_health(target, within=1.0)).serving:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {proc.name} service never served; see {proc.log}")
        await asyncio.sleep(0.2)


async def _node_ready() -> bool:
    """The Node library's dependencies, installed once (`npm ci`), when node and npm are here."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return False
    node_dir = REPO / "clients" / "node"
    if (node_dir / "node_modules" / "@grpc").is_dir():
        return True
    process = await asyncio.create_subprocess_exec(
        "npm",
        "ci",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        cwd=node_dir,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(process.wait(), 300) == 0


async def start(settings: Settings) -> Soak:
    folder = settings.folder
    pg = await asyncio.to_thread(Postgres, folder)
    await asyncio.to_thread(pg.track_commit_times)
    await apply_migrations(pg.url)
    (folder / "lowtide.toml").write_text(CONFIG)
    env = dict(os.environ, LOWTIDE_CONFIG=str(folder / "lowtide.toml"), LOWTIDE_AUTH="off", LOWTIDE_DATABASE_URL=pg.url)
    env["LOWTIDE_LOG_LEVEL"] = "WARNING"
    signal_target = f"127.0.0.1:{_free_port()}"
    signal = lowtide("signal", "signal", dict(env, LOWTIDE_SIGNAL_LISTEN=signal_target), folder)
    targets = [f"127.0.0.1:{_free_port()}" for _ in range(2)]
    schedulers = [
        lowtide(
            f"scheduler-{n}",
            "scheduler",
            dict(env, LOWTIDE_SCHEDULER_LISTEN=t, LOWTIDE_SCHEDULER_SIGNAL_TARGET=signal_target),
            folder,
        )
        for n, t in enumerate(targets, start=1)
    ]
    signal.start()
    await _serving(signal_target, signal)
    for scheduler, target in zip(schedulers, targets, strict=True):
        scheduler.start()
        await _serving(target, scheduler)
    relay = Relay(targets)
    worker_target = await relay.start()
    workers = []
    kinds = ["py", "py", "node", "node"] if settings.node and await _node_ready() else ["py", "py", "py"]
    go_binary, go_note = await go.build(folder) if settings.go else (None, "no Go worker: --no-go")
    notes = [go_note]
    if go_binary is not None:
        kinds.append("go")
    plan = [(f"worker-{k}-{n}", k, "default") for n, k in enumerate(kinds)]
    plan.append(("worker-fixed-py", "py", "fixed"))
    if "node" in kinds:
        plan.append(("worker-fixed-node", "node", "fixed"))
    for name, kind, pool in plan:
        out = folder / f"{name}.jsonl"
        queue = "fixed" if pool == "fixed" else "default"
        slots = "2" if pool == "fixed" else "8"
        if kind == "py":
            argv = [sys.executable, "-m", "soak.worker", "--target", worker_target, "--id", name, "--out", str(out)]
            argv += ["--pool", pool, "--queue", queue, "--slots", slots]
            wenv = dict(env)
        else:
            argv = ["node", str(REPO / "soak" / "worker.js")] if kind == "node" else [str(go_binary)]
            wenv = dict(env, LOWTIDE_TARGET=worker_target, WORKER_ID=name, SOAK_OUT=str(out))
            wenv.update(SOAK_POOL=pool, SOAK_QUEUE=queue, SOAK_SLOTS=slots)
        worker = Proc(name, argv, wenv, folder / f"{name}.log")
        worker.start()
        workers.append(worker)
    return Soak(settings, pg, signal, schedulers, workers, relay, targets, notes=notes)


async def _apply(soak: Soak, fault: PlannedFault, began: float) -> None:
    await asyncio.sleep(max(0.0, began + fault.at - time.monotonic()))
    at = time.time()
    if fault.kind == "cut":
        cut = soak.relay.cut()
        soak.faults.append(Fault("cut", "workers", at, at, cut))
        return
    target = soak.pg if fault.target == "postgres" else soak.by_name(fault.target)
    if getattr(target, "held", False) or (fault.target == "postgres" and soak.pg.down):
        soak.skipped[f"{fault.kind} {fault.target}: already down"] += 1
        return
    if isinstance(target, Proc):
        target.held = True
    try:
        if fault.kind == "kill":
            pid = target.kill()
            soak.deaths[pid] = at
            await asyncio.sleep(fault.outage)
            await asyncio.to_thread(target.start)
        else:
            pid = target.freeze()
            await asyncio.sleep(fault.outage)
            target.thaw()
    finally:
        if isinstance(target, Proc):
            target.held = False
    soak.faults.append(Fault(fault.kind, fault.target, at, time.time(), pid))


async def _watch(soak: Soak, stop: asyncio.Event) -> None:
    """Restarts a process that exited by itself (not held down by a fault), as a supervisor
    would, and samples the services' memory and descriptors."""
    while not stop.is_set():
        now = time.time()
        for proc in soak.procs:
            if not proc.held and proc.process is not None and not proc.alive:
                code = proc.process.returncode
                # How it ended says why: a status of its own, or the signal that killed it.
                soak.exits[f"{proc.name}: {_ended(code)}"] += 1
                soak.deaths.setdefault(proc.pid, now)
                proc.start()
            elif proc.alive and proc in (soak.signal, *soak.schedulers):
                found = collect.sample(proc.name, proc.pid, now)
                if found is not None:
                    soak.samples.append(found)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)


def _ended(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


async def _check_during(soak: Soak, stop: asyncio.Event) -> None:
    """Every 10 s: the stranded check on the unfinished tasks, and the signal's new history
    (the service keeps a bounded history, so the checker keeps its own copy)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 10.0)
        try:
            after = soak.history[-1].at if soak.history else 0.0
            soak.history += await collect.signal_history(soak.pg.url, "grid", after)
            rows = await collect.unfinished(soak.pg.url)
        except Exception as error:  # the database is down or frozen: look again later
            log.debug("soak.check_skipped", extra={"error": str(error)})
            continue
        found = invariants.stranded(rows, collect.executions(soak.outs), set(soak.deaths), time.time(), STRANDED_AFTER)
        for violation in found:
            soak.during.setdefault((violation.invariant, violation.subject), violation)


async def _undo_all(soak: Soak) -> None:
    """Everything running again once the faults stop: continued, restarted, the database up."""
    soak.pg.thaw()
    if soak.pg.down:
        await asyncio.to_thread(soak.pg.start)
    for proc in soak.procs:
        proc.thaw()


async def _drain(soak: Soak) -> None:
    deadline = time.monotonic() + DRAIN_WITHIN
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if not await collect.unfinished(soak.pg.url):
                return
        await asyncio.sleep(2)


async def run(settings: Settings) -> int:
    settings.folder.mkdir(parents=True, exist_ok=True)
    print(
        f"soak: seed {settings.seed}, {settings.duration:g} s, load {settings.rate:g}/s, in {settings.folder}",
        flush=True,
    )
    soak = await start(settings)
    names = [w.name for w in soak.workers]
    planned = plan_faults(
        settings.seed,
        settings.duration,
        mean_gap=settings.mean_gap,
        schedulers=[s.name for s in soak.schedulers],
        workers=names,
    )
    (settings.folder / "faults-planned.txt").write_text("".join(f"{p}\n" for p in planned))
    print(f"soak: {len(planned)} faults planned (faults-planned.txt); replay: --seed {settings.seed}", flush=True)
    load = Load(settings.seed, soak.targets, settings.rate, settings.folder / "acks.jsonl")
    stop_load, stop_watch = asyncio.Event(), asyncio.Event()
    began = time.monotonic()
    started_at = time.time()
    watchers = [asyncio.create_task(_watch(soak, stop_watch)), asyncio.create_task(_check_during(soak, stop_watch))]
    loading = asyncio.create_task(load.run(stop_load))
    injected = [asyncio.create_task(_apply(soak, p, began)) for p in planned]
    try:
        await asyncio.sleep(settings.duration)
        stop_load.set()
        await asyncio.gather(*injected)
        await _undo_all(soak)
        await asyncio.wait_for(loading, 120)
        await _drain(soak)
        stop_watch.set()
        await asyncio.gather(*watchers)
        soak.history += await collect.signal_history(soak.pg.url, "grid", soak.history[-1].at if soak.history else 0.0)
        violations, work = await judge(soak, load, started_at)
    finally:
        for task in (*injected, *watchers, loading):
            task.cancel()
        await load.close()
        await soak.relay.close()
        for proc in soak.procs:
            await asyncio.to_thread(proc.stop)
        await asyncio.to_thread(soak.pg.stop)
    text = summary(settings, soak, load=load, work=work, violations=violations, planned=len(planned))
    print(text, flush=True)
    (settings.folder / "summary.txt").write_text(text)
    (settings.folder / "violations.txt").write_text("".join(f"{v}\n" for v in violations))
    return 1 if violations else 0


async def judge(soak: Soak, load: Load, started_at: float) -> tuple[list[Violation], dict[str, int]]:
    rows = await collect.tasks(soak.pg.url)
    runs = collect.executions(soak.outs)
    end = time.time()
    found = [
        *invariants.submits_exist_once(load.acks, rows, load.refused_resubmits),
        *soak.during.values(),
        *invariants.tasks_end(rows),
        *invariants.one_runner_per_attempt(runs, soak.deaths, end),
        *invariants.retries_justified(rows, runs, soak.faults, lease=LEASE, slack=5.0),
        *invariants.holds_respected(rows, soak.history, deferrable={"defer"}, threshold=THRESHOLD, lag=2.0),
        *invariants.fixed_starts_honest(rows, soak.faults, slack=LEASE),
        *invariants.resources_bounded(soak.samples, rss_limit=RSS_LIMIT, fd_limit=FD_LIMIT),
    ]
    work: dict[str, int] = Counter(f"tasks {r.state}" for r in rows)
    work["tasks"] = len(rows)
    work["attempts run by workers"] = len(runs)
    work["attempts run by Node workers"] = sum(1 for r in runs if "-node" in r.worker)
    work["attempts run by Go workers"] = sum(1 for r in runs if "-go" in r.worker)
    work["deferrable tasks dispatched by max_defer"] = sum(1 for r in rows if r.released_by == "max_defer")
    work["deferrable tasks dispatched below the threshold"] = sum(
        1 for r in rows if r.activity_type == "defer" and r.attempt and r.released_by != "max_defer"
    )
    work["fixed starts hit"] = sum(1 for r in rows if r.start_at is not None and r.start_hit)
    work["fixed starts missed"] = sum(1 for r in rows if r.start_at is not None and r.missed)
    work["retried tasks"] = sum(1 for r in rows if r.attempt > 1)
    work["signal values seen"] = len(soak.history)
    work["seconds"] = int(end - started_at)
    return found, dict(work)
