"""Per task metrics, recorded where the events happen: the dispatcher's send (dispatched, queue
wait, dispatch latency, time held, the signal at dispatch) and the completer (finished, run time).

Every figure comes from the rows those already have in hand (the claim's RETURNING, the finish's
RETURNING): no query per task. Queue and activity type labels are capped (domain.timings.LabelCap).

The histograms are lowtide.histograms' (a value recorded is a bisect, not the SDK's 7 µs), with
the same names, buckets and labels on the Prometheus endpoint and over OTLP.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from opentelemetry.metrics import Meter

from lowtide.config import Config
from lowtide.histograms import Histograms, Labels
from scheduler_service.domain.timings import HoldEpisode, LabelCap, Timings, timings
from scheduler_service.fleet.sessions import WorkerSession
from scheduler_service.holds.signals import SignalHolds
from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.rows.tasks import FinishedRow

QUEUE_WAIT = "lowtide.task.queue_wait.duration"
RUN = "lowtide.task.run.duration"
DISPATCH_LATENCY = "lowtide.task.dispatch.duration"
HELD = "lowtide.task.held.duration"
SIGNAL_AT_DISPATCH = "lowtide.task.dispatch.signal"

# Waits, from milliseconds (a task claimed at once) to days (a deferral of a batch job).
WAIT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
    7200, 14400, 28800, 43200, 86400, 172800, 604800,
)  # fmt: skip
# Run times: a millisecond no-op to a day-long job.
RUN_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600, 1800, 3600,
    7200, 21600, 86400,
)  # fmt: skip
# The scheduler's own latency: sub-millisecond to seconds (longer only while slots are full).
DISPATCH_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)  # fmt: skip
# Grid carbon intensity in gCO2/kWh (or a power price per MWh): very clean grids to coal.
SIGNAL_BUCKETS = (0, 25, 50, 75, 100, 125, 150, 200, 250, 300, 350, 400, 500, 600, 700, 800, 1000, 1500)

# (queue, activity type) label sets kept made; the caps bound them already, this bounds the memo.
MAX_LABEL_SETS = 4096


class TaskMetrics:
    def __init__(self, meter: Meter, histograms: Histograms, *, holds: SignalHolds, config: Config) -> None:
        self._holds = holds
        limit = config.scheduler.metrics_label_values
        per_queue = holds.config.per_queue or {}
        self._queue = LabelCap({"default", *config.queues, *per_queue}, limit)
        held = holds.config.deferrable.union(*per_queue.values())
        self._type = LabelCap({*config.types, *held}, limit)
        self._label_sets: dict[tuple[str, str], dict[str, str]] = {}
        # The same as the histograms' label tuples, and with a reason or the signal added.
        self._label_keys: dict[tuple[str, ...], Labels] = {}
        self.dispatched = meter.create_counter(
            "lowtide.task.dispatched", unit="{task}", description="Attempts dispatched to workers"
        )
        self.finished = meter.create_counter(
            "lowtide.task.finished", unit="{task}", description="Attempts ended, by what followed (state)"
        )
        self.queue_wait = histograms.create(
            QUEUE_WAIT,
            unit="s",
            description="From due (submitted, backoff over, released) to started",
            bounds=WAIT_BUCKETS,
        )
        self.run = histograms.create(
            RUN, unit="s", description="From started to finished, as the worker reported", bounds=RUN_BUCKETS
        )
        self.dispatch_latency = histograms.create(
            DISPATCH_LATENCY,
            unit="s",
            description="From claimable (due, no hold on it) to the assignment sent",
            bounds=DISPATCH_BUCKETS,
        )
        self.held = histograms.create(
            HELD,
            unit="s",
            description="How long held work waited, at its release, by reason: cost_hold, planned_release",
            bounds=WAIT_BUCKETS,
        )
        self.signal_at_dispatch = histograms.create(
            SIGNAL_AT_DISPATCH,
            description="The cost signal's value at dispatch, per task (unit: the unit label)",
            bounds=SIGNAL_BUCKETS,
        )

    def _labels(self, queue: str, activity_type: str) -> dict[str, str]:
        """The labels of a (queue, type), made once: every task of a batch has the same few. The
        caps keep what they said for a value, so a label kept here is the one they would give."""
        key = (queue, activity_type)
        labels = self._label_sets.get(key)
        if labels is None:
            if len(self._label_sets) >= MAX_LABEL_SETS:
                self._label_sets.clear()
            labels = {"queue": self._queue(queue), "activity_type": self._type(activity_type)}
            self._label_sets[key] = labels
        return labels

    def _key(self, queue: str, activity_type: str, *extra: str) -> Labels:
        """The histograms' labels of a (queue, type), with `extra` (name, value, ...) pairs added."""
        key = (queue, activity_type, *extra)
        labels = self._label_keys.get(key)
        if labels is None:
            if len(self._label_keys) >= MAX_LABEL_SETS:
                self._label_keys.clear()
            pairs = dict(zip(extra[::2], extra[1::2], strict=True))
            labels = tuple(sorted({**self._labels(queue, activity_type), **pairs}.items()))
            self._label_keys[key] = labels
        return labels

    def sent(self, sent: Sequence[tuple[WorkerSession, Sequence[ClaimedRow]]]) -> list[list[Timings]]:
        """Attempts one send just handed to these sessions' workers (of one dispatch group: one
        pool, the same types held for all); their timings, per session and in order (for their
        traces). Counted once for the send."""
        if not sent:
            return []
        first = sent[0][0]
        self.dispatched.add(sum(len(rows) for _, rows in sent), {"pool": first.pool})
        now = datetime.now(UTC)
        episode = self._episode()
        signal = self._holds.signal
        signal_labels = ("signal", self._holds.signal_name, "unit", signal.unit if signal else "")
        held_types: dict[str, frozenset[str]] = {}  # per queue, the types a cost hold may hold
        # Per label set, the figures of the send: recorded one batch each (one lock, one lookup).
        waits: defaultdict[Labels, list[float]] = defaultdict(list)
        latencies: defaultdict[Labels, list[float]] = defaultdict(list)
        out = []
        for _, rows in sent:
            figures_of_session = []
            for row in rows:
                labels = self._key(row.queue, row.activity_type)
                types = held_types.get(row.queue)
                if types is None:
                    types = held_types[row.queue] = self._holds.config.for_queue(row.queue) | first.cost_deferrable
                deferrable = row.kind == "activity" and row.start_at is None and row.activity_type in types
                figures = timings(row, deferrable=deferrable, sent_at=now, episode=episode)
                figures_of_session.append(figures)
                waits[labels].append(figures.queue_wait)
                latencies[labels].append(figures.dispatch_latency)
                if figures.held is not None:
                    reason, seconds = figures.held
                    self.held.record(seconds, self._key(row.queue, row.activity_type, "reason", reason))
                if row.signal_at_dispatch is not None:
                    self.signal_at_dispatch.record(
                        row.signal_at_dispatch, self._key(row.queue, row.activity_type, *signal_labels)
                    )
            out.append(figures_of_session)
        for labels, values in waits.items():
            self.queue_wait.record_many(values, labels)
        for labels, values in latencies.items():
            self.dispatch_latency.record_many(values, labels)
        return out

    def ended(self, rows: Iterable[FinishedRow]) -> None:
        """Attempts the completer applied (a worker's report): by state, and their run time."""
        # Counted once per (queue, type, state) of the batch, not once per task.
        ended: Counter[tuple[str, str, str]] = Counter()
        runs: defaultdict[Labels, list[float]] = defaultdict(list)
        for row in rows:
            ended[(row.queue, row.activity_type, row.state)] += 1
            if row.run_time is not None:
                runs[self._key(row.queue, row.activity_type)].append(max(0.0, row.run_time.total_seconds()))
        for labels, values in runs.items():
            self.run.record_many(values, labels)
        for (queue, activity_type, state), count in ended.items():
            self.finished.add(count, {**self._labels(queue, activity_type), "state": state})

    def _episode(self) -> HoldEpisode | None:
        state = self._holds.state
        if state.active and state.since is not None:
            return HoldEpisode(state.since, None)
        return self._holds.last_hold
