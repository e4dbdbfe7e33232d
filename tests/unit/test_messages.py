"""What a worker is sent of a claimed attempt: its start-to-close deadline and heartbeat timeout
are the instants and durations protobuf's own conversions make, for any instant in any time zone
(a naive one taken as UTC) and any number of milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from google.protobuf import duration_pb2, timestamp_pb2
from hypothesis import example, given
from hypothesis import strategies as st

from scheduler_service.rows.claims import ClaimedRow
from scheduler_service.wire.outbound import assignment

INSTANTS = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.timezones())


def _row(close_deadline: datetime | None, heartbeat_ms: int | None) -> ClaimedRow:
    now = datetime.now(UTC)
    return ClaimedRow(
        id=7, attempt=2, worker_id="w", queue="default", kind="activity", activity_type="echo", payload=b"x",
        max_attempts=3, initial_backoff_ms=1000, backoff_coefficient=2.0, max_backoff_ms=60_000,
        non_retryable_error_types=[], close_deadline=close_deadline, heartbeat_ms=heartbeat_ms, priority=0,
        run_at=now, start_at=None, start_tolerance_ms=None, start_hit=None, pool="default", headers=None,
        started_at=now, released_by=None, hold_deadline=None, planned_since=None, signal_at_dispatch=None,
        signal_at_submit=None,
    )  # fmt: skip


@given(INSTANTS | INSTANTS.map(lambda d: d.replace(tzinfo=None)), st.integers(-(10**12), 10**12))
@example(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), -1)
@example(datetime(1970, 1, 1), -1001)
@example(datetime(2026, 12, 2, 9, 0, 0, 1, tzinfo=UTC), 999)
@example(datetime(1983, 4, 24, 2, 0, tzinfo=ZoneInfo("America/Dawson")), 0)  # in a DST gap
def test_the_deadline_and_heartbeat_timeout_are_protobuf_s_own(deadline: datetime, heartbeat_ms: int) -> None:
    expected_deadline = timestamp_pb2.Timestamp()
    expected_deadline.FromDatetime(deadline)
    expected_heartbeat = duration_pb2.Duration()
    expected_heartbeat.FromMilliseconds(heartbeat_ms)
    message = assignment(_row(deadline, heartbeat_ms))
    assert message.start_to_close_deadline == expected_deadline
    assert message.heartbeat_timeout == expected_heartbeat
    # The same instant (compared in UTC: a local time in a DST gap or fold never equals one of
    # another zone, PEP 495).
    assert message.start_to_close_deadline.ToDatetime(tzinfo=UTC) == (
        deadline.astimezone(UTC) if deadline.tzinfo is not None else deadline.replace(tzinfo=UTC)
    )


def test_an_attempt_without_a_deadline_or_heartbeat_timeout_is_sent_none() -> None:
    message = assignment(_row(None, None))
    assert not message.HasField("start_to_close_deadline")
    assert not message.HasField("heartbeat_timeout")
    assert (message.task.task_id, message.task.attempt, message.payload) == (7, 2, b"x")
