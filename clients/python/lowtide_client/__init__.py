"""Python client for lowtide, a cost-aware task scheduler.

``Client`` submits and inspects tasks (``SchedulerService``); ``Worker`` runs activities for
the tasks the scheduler assigns (``WorkerService.Connect``). Both use ``grpc.aio``. gRPC
failures surface as ``grpc.aio.AioRpcError``, unwrapped, so their status codes are the
scheduler's own.
"""

from lowtide_client import activity
from lowtide_client._client import FINISHED_STATES, Client, Submitted, reservation_conflict
from lowtide_client._errors import NonRetryableError
from lowtide_client._holds import CostHold
from lowtide_client._signal import SignalClient
from lowtide_client._spec import TaskOptions, task_spec
from lowtide_client._sync import SyncClient, SyncSubmitted
from lowtide_client._typed import TaskNotCompleted
from lowtide_client._worker import Worker
from lowtide_proto.durations import format_duration, parse_duration
from lowtide_proto.lowtide.v1.task_pb2 import RetryPolicy, Task, TaskKind, TaskSpec, TaskState

__all__ = [
    "FINISHED_STATES",
    "Client",
    "CostHold",
    "NonRetryableError",
    "RetryPolicy",
    "SignalClient",
    "Submitted",
    "SyncClient",
    "SyncSubmitted",
    "Task",
    "TaskKind",
    "TaskNotCompleted",
    "TaskOptions",
    "TaskSpec",
    "TaskState",
    "Worker",
    "activity",
    "format_duration",
    "parse_duration",
    "reservation_conflict",
    "task_spec",
]
