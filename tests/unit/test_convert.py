"""Validation of submissions: each bad field is named, nothing else is guessed."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2

from lowtide.config import RetryConfig
from lowtide.errors import InvalidArgument, TooLarge
from lowtide_client._proto.lowtide.v1 import task_pb2
from scheduler_service.convert import new_task
from scheduler_service.domain.model import Kind


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
