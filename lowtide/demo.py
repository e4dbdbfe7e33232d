"""`lowtide up --demo`: the replayed 2020 GB grid trace drives the signal, two demo workers run
`echo` and the cost-deferrable `train`, a generator submits a mix every second, and a live line
shows what is held, claimable and running as the signal crosses its threshold. With
`--recorded`, the signal is the recorded UK week instead (the `recorded` feed): the forecasts
the UK Carbon Intensity API issued in March 2023, as issued, and the values that came.

The trace is carbon intensity of the Great Britain grid, 2019-12-20 to 2021-01-09, from Wiesner
et al., "Let's Wait Awhile: How Temporal Workload Shifting Can Reduce Carbon Emissions in the
Cloud" (Middleware 2021).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from lowtide_client import Client, task_spec

log = logging.getLogger("lowtide.demo")

# The trace's median, so the signal is high about half the time.
DEMO_THRESHOLD = "215"
# One day of grid per minute: a 30-minute step every 1.25 s.
DEMO_SPEED = "1440"


# The recorded week's median (of the values that came, 14 to 21 March 2023).
RECORDED_THRESHOLD = "155"


def demo_env(*, recorded: bool = False) -> dict[str, str]:
    """Settings the demo's services get, unless the user set them."""
    env = {
        "LOWTIDE_SIGNAL_FEED": "recorded" if recorded else "replay",
        "LOWTIDE_SIGNAL_REPLAY_SPEED": DEMO_SPEED,
        "LOWTIDE_COST_DEFER_THRESHOLD": RECORDED_THRESHOLD if recorded else DEMO_THRESHOLD,
        "LOWTIDE_COST_DEFERRABLE_ACTIVITIES": "train",
    }
    if recorded:
        # The recording's forecasts state no error: the calibration learns it, every recorded day
        # (a minute), so the console says it is learned within minutes, not the default's ten.
        env["LOWTIDE_SIGNAL_CALIBRATE_EVERY"] = "1m"
    return env


def demo_worker_args(target: str, index: int) -> list[str]:
    return [
        "demo-worker",
        "--target",
        target,
        "--types",
        "echo,train",
        "--slots",
        "4",
        "--worker-id",
        f"demo-worker-{index}",
    ]


async def generate(target: str, stopping: asyncio.Event) -> None:
    """Submits two `echo` and one `train` (0.5 s of work) every second."""
    async with Client(target) as client:
        while not stopping.is_set():
            try:
                await client.submit_many(
                    [task_spec("echo", b"hello"), task_spec("echo", b"world"), task_spec("train", b"0.5")]
                )
            except grpc.aio.AioRpcError as error:
                log.warning("demo.submit_failed", extra={"code": error.code().name})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 1.0)


async def show(target: str, stopping: asyncio.Event) -> None:
    """One line every two seconds: the signal and hold, then held / claimable / running work."""
    async with Client(target) as client:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 2.0)
            if stopping.is_set():
                return
            try:
                status = await client.status()
            except grpc.aio.AioRpcError:
                continue
            hold = status.hold
            value = f"{hold.value:6.1f}" if hold.HasField("value") else "   n/a"
            held = sum(q.held_depth for q in status.queues)
            claimable = sum(q.depth for q in status.queues)
            running = sum(q.running for q in status.queues)
            carbon = next((c for c in status.carbon if c.activity_type == "train"), None)
            saved = (
                f"  train: {carbon.mean_at_submit:5.1f} at submit -> {carbon.mean_at_dispatch:5.1f} at dispatch"
                if carbon
                else ""
            )
            print(
                f"signal {value} / {hold.threshold:g} {'HIGH - holding train' if hold.active else 'low  - releasing  '}"
                f" | held {held:4d}  claimable {claimable:4d}  running {running:3d}"
                f"  reserved -{saved}",
                flush=True,
            )
