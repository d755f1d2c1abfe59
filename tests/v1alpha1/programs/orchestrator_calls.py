"""A program written for the v1alpha1 Python client: the orchestrator's calls in each
form its README documents, and the errors it catches.

Run with either package named `timeslice` installed (the v1alpha1 client's, or
ours): ``python orchestrator_calls.py ADDRESS GROUP``. It prints one line,
``RESULT {json}``, of what it saw; the tests compare it across both.
"""

from __future__ import annotations

import json
import sys
import time

import grpc

from timeslice import TimeSliceOrchestratorClient
from timeslice.orchestrator import (
    AcquireResult,
    AgentJobState,
    GroupLockState,
    GroupStatus,
    OrchestratorConnectionError,
    OrchestratorError,
    OrchestratorGroupStatus,
    OrchestratorInternalError,
    OrchestratorInvalidArgumentError,
    OrchestratorTimeoutError,
    SnapshotAgentJobState,
    YieldResult,
)
from timeslice.orchestrator import TimeSliceOrchestratorClient as SameClient
from timeslice.orchestrator.exceptions import OrchestratorError as SameError
from timeslice.orchestrator.types import GroupLockState as SameState


def status_of(error: BaseException) -> str:
    """The gRPC status the server answered: the v1alpha1 client keeps the grpcio
    error it wraps as the cause, ours carries it as `code`."""
    cause = error.__cause__
    if isinstance(cause, grpc.RpcError):
        return cause.code().name
    code = getattr(error, "code", None)
    return code.name if code is not None else type(error).__name__


def main() -> None:
    address, group = sys.argv[1], sys.argv[2]
    seen: dict[str, object] = {}
    seen["names"] = [
        SameClient is TimeSliceOrchestratorClient,
        SameError is OrchestratorError,
        SameState is GroupLockState,
        all(
            issubclass(cls, OrchestratorError)
            for cls in (
                OrchestratorConnectionError,
                OrchestratorTimeoutError,
                OrchestratorInvalidArgumentError,
                OrchestratorInternalError,
            )
        ),
        [state.name for state in AgentJobState],
        list(GroupStatus.__dataclass_fields__)[:7],
        list(SnapshotAgentJobState.__dataclass_fields__)[:3],
    ]

    a = TimeSliceOrchestratorClient(address, "job-a", group)
    b = TimeSliceOrchestratorClient(target=address, job_id="job-b", group_id=group)

    first = a.acquire(timeout_sec=10.0)
    seen["acquire"] = [isinstance(first, AcquireResult), first.success]
    status = a.get_status()
    seen["status"] = [
        isinstance(status, OrchestratorGroupStatus),
        status.group.group_id,
        status.group.group_state.name,
        status.group.locking_job,
        status.group.waiter_queue_depth,
    ]

    # A Yield by a job that does not hold the lock.
    try:
        b.release()
        seen["release_by_other"] = "accepted"
    except OrchestratorError as error:
        seen["release_by_other"] = status_of(error)

    # An Acquire that cannot be granted in time gives up at its timeout, and leaves.
    started = time.monotonic()
    try:
        b.acquire(timeout_sec=1.0)
        seen["timeout"] = "granted"
    except OrchestratorTimeoutError as error:
        took = time.monotonic() - started
        seen["timeout"] = [status_of(error), 0.9 <= took < 1.5]
    deadline = time.monotonic() + 5
    while a.get_status().group.waiter_queue_depth and time.monotonic() < deadline:
        time.sleep(0.02)
    seen["queue_after_timeout"] = a.get_status().group.waiter_queue_depth

    released = a.release()
    seen["release"] = [
        isinstance(released, YieldResult),
        released.success,
        released.pending_waiters,
        released.snapshot_deferred,
    ]
    seen["idle"] = a.get_status().group.group_state.name

    with b.on_accelerators(timeout_sec=5.0) as result:
        seen["with"] = [result.success, b.get_status().group.locking_job]
    seen["after_with"] = b.get_status().group.locking_job

    @a.on_accelerators(timeout_sec=5.0)
    def decorated() -> str:
        return a.get_status().group.locking_job

    seen["decorated"] = [decorated(), a.get_status().group.locking_job]

    seen["list_groups"] = group in a.list_groups()

    try:
        a.get_status(group_id=f"{group}-missing")
        seen["unknown_group"] = "found"
    except OrchestratorError as error:
        seen["unknown_group"] = status_of(error)

    plain = TimeSliceOrchestratorClient(target=address)
    try:
        plain.acquire(group_id=group)
        seen["no_job_id"] = "sent"
    except ValueError:
        seen["no_job_id"] = "ValueError"
    plain.acquire(job_id="job-c", group_id=group)
    seen["override"] = plain.get_status(group_id=group).group.locking_job
    plain.release(job_id="job-c", group_id=group)
    plain.close()

    with TimeSliceOrchestratorClient(address, "job-d", group) as scoped:
        with scoped.on_accelerators(job_id="job-e") as result:
            seen["override_with"] = [result.success, scoped.get_status().group.locking_job]

    a.close()
    b.close()
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
