"""The planned release at work through the real services: the 2020 GB trace replayed at an hour
per second (a 48-hour forecast is 48 seconds ahead), a scheduler that holds `train`, one worker.
Every half second a 30-minute (trace time) `train` task arrives that may start up to 8 hours
(trace time) later; the figure is the mean signal at dispatch against the mean at submission —
the carbon the plans avoided — beside the means the plans expected.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench._pg import throwaway_database
from bench.lowtide_run import _spawn, _stop
from lowtide_client import Client
from tests.helpers import free_port

SPEED = 3600.0  # trace seconds per second
TASKS = 40
EVERY = 0.5  # seconds between arrivals (30 trace minutes)
SLACK = timedelta(hours=8) / SPEED
DURATION = timedelta(minutes=30) / SPEED


async def live_carbon(server_url: str) -> dict[str, Any]:
    async with throwaway_database(server_url, "bench_live_carbon") as url:
        signal_target, scheduler_target = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = dict(
            os.environ,
            LOWTIDE_DATABASE_URL=url,
            LOWTIDE_LOG_LEVEL="WARNING",
            LOWTIDE_AUTH="off",
            LOWTIDE_SIGNAL_LISTEN=signal_target,
            LOWTIDE_SIGNAL_METRICS_LISTEN="",
            LOWTIDE_SIGNAL_FEED="replay",
            LOWTIDE_SIGNAL_REPLAY_SPEED=str(SPEED),
            # Forecasts with an error growing with the horizon, each point stating it.
            LOWTIDE_SIGNAL_REPLAY_FORECAST_MODEL="horizon",
            LOWTIDE_SIGNAL_REFRESH="250ms",
            LOWTIDE_SCHEDULER_LISTEN=scheduler_target,
            LOWTIDE_SCHEDULER_METRICS_LISTEN="",
            LOWTIDE_SCHEDULER_SIGNAL_TARGET=signal_target,
            LOWTIDE_COST_DEFERRABLE_ACTIVITIES="train",
            LOWTIDE_COST_DEFER_THRESHOLD="215",
        )
        processes = [await _spawn(env, "signal", "serve"), await _spawn(env, "scheduler", "serve")]
        try:
            async with Client(scheduler_target) as client:
                await client.list(page_size=1)  # retries until the scheduler listens
                processes.append(
                    await _spawn(env, "demo-worker", "--target", scheduler_target, "--types", "train", "--slots", "8")
                )
                await asyncio.sleep(3)  # the first states and forecast reach the scheduler
                for _ in range(TASKS):
                    await client.submit(
                        "train",
                        "0",
                        latest_start=datetime.now(UTC) + SLACK,
                        estimated_duration=DURATION,
                    )
                    await asyncio.sleep(EVERY)
                await asyncio.sleep(SLACK.total_seconds() + 3)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT signal_at_submit, signal_at_dispatch, planned_intensity,"
                    " extract(epoch FROM started_at - latest_start) * 1000"
                    " FROM lowtide.tasks WHERE activity_type = 'train' AND state = 'completed'"
                )
                rows = await cur.fetchall()
        finally:
            await _stop(processes)
    submitted = [float(r[0]) for r in rows if r[0] is not None]
    dispatched = [float(r[1]) for r in rows if r[1] is not None]
    planned = [float(r[2]) for r in rows if r[2] is not None]
    at_submit, at_dispatch = statistics.fmean(submitted), statistics.fmean(dispatched)
    return {
        "tasks": TASKS,
        "completed": len(rows),
        # Started by the latest start (within one 50 ms scheduling step), and the latest of all.
        "on_time": sum(1 for r in rows if float(r[3]) <= 50),
        "max_ms_past_latest_start": round(max(float(r[3]) for r in rows), 1),
        "mean_at_submit": round(at_submit, 1),
        "mean_at_dispatch": round(at_dispatch, 1),
        "mean_planned": round(statistics.fmean(planned), 1) if planned else None,
        "saving_vs_submit": round(1 - at_dispatch / at_submit, 4),
        "replay_speed": SPEED,
        "forecast_model": "horizon (3 % at 1 h to 15 % at 24 h, AR(1), ramps shifted)",
        "slack_trace_hours": 8,
    }
