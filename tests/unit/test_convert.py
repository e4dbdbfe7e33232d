"""Validation of submissions: each bad field is named, nothing else is guessed."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from lowtide.config import RetryConfig
from lowtide.errors import InvalidArgument, TooLarge
from lowtide_proto.lowtide.v1 import task_pb2
from scheduler_service.domain.model import Kind
from scheduler_service.wire.inbound import new_task


def check(spec: task_pb2.TaskSpec) -> object:
    return new_task(spec, defaults=RetryConfig(), max_payload=16)


def test_defaults_fill_the_unset_fields() -> None:
    task = new_task(task_pb2.TaskSpec(activity_type="echo"), defaults=RetryConfig(), max_payload=16)
    assert (task.queue, task.kind, task.retry.max_attempts) == ("default", Kind.ACTIVITY, 3)
    assert task.schedule_to_start is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (task_pb2.TaskSpec(), "activity_type"),
        (task_pb2.TaskSpec(activity_type=" x"), "activity_type"),
        (task_pb2.TaskSpec(activity_type="x" * 201), "activity_type"),
        (task_pb2.TaskSpec(activity_type="x", kind=7), "kind"),  # type: ignore[arg-type]
        (
            task_pb2.TaskSpec(activity_type="x", start_to_close_timeout=duration_pb2.Duration(seconds=-1)),
            "start_to_close_timeout",
        ),
        (
            task_pb2.TaskSpec(activity_type="x", heartbeat_timeout=duration_pb2.Duration(seconds=10**9)),
            "heartbeat_timeout",
        ),
        (
            task_pb2.TaskSpec(activity_type="x", schedule_to_start_timeout=duration_pb2.Duration()),
            "schedule_to_start_timeout",
        ),
        (
            task_pb2.TaskSpec(activity_type="x", retry_policy=task_pb2.RetryPolicy(backoff_coefficient=float("nan"))),
            "retry_policy.backoff_coefficient",
        ),
        (
            task_pb2.TaskSpec(activity_type="x", retry_policy=task_pb2.RetryPolicy(backoff_coefficient=0.5)),
            "retry_policy.backoff_coefficient",
        ),
        (
            task_pb2.TaskSpec(
                activity_type="x",
                retry_policy=task_pb2.RetryPolicy(
                    initial_backoff=duration_pb2.Duration(seconds=5),
                    max_backoff=duration_pb2.Duration(seconds=1),
                ),
            ),
            "retry_policy.max_backoff",
        ),
    ],
)
def test_bad_fields_are_named(spec: task_pb2.TaskSpec, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check(spec)
    assert caught.value.field == field


def test_a_payload_over_the_limit_is_too_large() -> None:
    with pytest.raises(TooLarge, match="17 bytes"):
        check(task_pb2.TaskSpec(activity_type="x", payload=b"x" * 17))


# 9999-12-31T23:59:59Z, the last second a Timestamp (and a Python datetime) can hold.
LAST_SECOND = timestamp_pb2.Timestamp(seconds=253402300799)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (task_pb2.TaskSpec(activity_type="x", start_at=LAST_SECOND), "start_at"),
        (
            task_pb2.TaskSpec(
                activity_type="x",
                start_at=LAST_SECOND,
                start_tolerance=duration_pb2.Duration(seconds=3600),
                estimated_duration=duration_pb2.Duration(seconds=60),
            ),
            "start_at",
        ),
        (
            task_pb2.TaskSpec(
                activity_type="x", deadline=LAST_SECOND, estimated_duration=duration_pb2.Duration(seconds=60)
            ),
            "deadline",
        ),
        (task_pb2.TaskSpec(activity_type="x", latest_start=LAST_SECOND), "latest_start"),
    ],
)
def test_a_time_at_the_end_of_year_9999_is_refused_naming_its_field(spec: task_pb2.TaskSpec, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check(spec)
    assert caught.value.field == field
    assert "at most 366 days ahead" in str(caught.value)
