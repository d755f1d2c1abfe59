"""The agent's records as the wire shows them: jobs, operations, switch steps,
workload commands and capabilities."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from timeslice.agent import state as st
from timeslice.agent.channels import Capabilities, Command
from timeslice.agent.state import Job, JobState, Operation, OpStatus
from timeslice.agent.switching import SwitchReport, SwitchStep
from timeslice.api import hot
from timeslice.api.backend_config import MODE_NAME
from timeslice.api.bounds import MAX_TEXT_BYTES, cap
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import DISCARD, OFFLOAD
from timeslice.errors import InvalidArgumentError
from timeslice.kinds import Liveness

_MODE: Final = {OFFLOAD: pb.SuspendMode.OFFLOAD, DISCARD: pb.SuspendMode.DISCARD}
JOB_STATE: Final = {state: pb.JobState[state.value] for state in JobState}
_OP_STATUS: Final = {status: pb.OperationStatus[status.value] for status in OpStatus}
# A workload's word for where it keeps an offloaded context is shown, never parsed.
MAX_STORE_BYTES: Final = 64
_LIVENESS: Final = {
    Liveness.UNKNOWN: pb.Liveness.UNSPECIFIED,
    Liveness.ALIVE: pb.Liveness.ALIVE,
    Liveness.GONE: pb.Liveness.GONE,
}


def job_status(job: Job, liveness: Liveness, store: str = "") -> pb.JobStatus:
    """A job of the table as the wire shows it; `store` is where its workload, over
    the channel open now, said it keeps an offloaded context."""
    return pb.JobStatus(**_job_status_fields(job, liveness, store))


def _job_status_fields(job: Job, liveness: Liveness, store: str = "") -> dict[str, Any]:
    return {
        "job_id": job.job,
        "state": JOB_STATE[job.state],
        "group": job.group,
        "backend": job.backend,
        "fault": cap(job.fault, MAX_TEXT_BYTES),
        "operation_id": job.operation,
        "liveness": _LIVENESS[liveness],
        "store": store,
    }


def _switch_step_fields(step: SwitchStep) -> dict[str, Any]:
    op = step.op
    if op is None:
        return {
            "job_id": step.job,
            "kind": step.kind,
            "status": pb.OperationStatus.FAILED,
            "error": cap(step.error, MAX_TEXT_BYTES),
            "refused": step.refused,
        }
    status, error, elapsed_ms = _outcome(op)
    overlapped = round(step.overlap * 1000)
    return {
        "job_id": step.job,
        "kind": step.kind,
        "operation_id": op.op_id,
        "status": status,
        "error": error,
        "storage_bytes": op.storage_bytes or 0,
        "device_bytes": op.device_bytes or 0,
        "elapsed_ms": max(0, elapsed_ms - overlapped),
        "overlapped_ms": overlapped,
    }


def switch_group_reply(
    report: SwitchReport,
    node: str,
    jobs: Iterable[Job],
    version: int,
    liveness: Callable[[Job], Liveness],
) -> bytes:
    """The `SwitchGroupResponse` of `report`, with `jobs` (the group's) as they are
    now, encoded by hand (`timeslice.api.hot`: it is on every switch's path)."""

    def status(job: Job) -> bytes:
        return hot.job_status(**_job_status_fields(job, liveness(job)))

    return hot.switch_group_response(
        steps=[hot.switch_step(**_switch_step_fields(step)) for step in report.steps],
        restored=report.restored,
        next_state=JOB_STATE[report.next_state] if report.next_state else 0,
        faulted=[status(job) for job in report.faulted],
        node_name=node,
        jobs=[status(job) for job in jobs],
        table_version=version,
    )


def capabilities_of(register: pb.RegisterWorkload) -> Capabilities:
    if not register.job_id:
        raise InvalidArgumentError("register.job_id must not be empty")
    caps = register.capabilities or pb.WorkloadCapabilities()
    modes = tuple(MODE_NAME[m] for m in caps.supported_modes if MODE_NAME.get(m))
    if len(caps.store.encode()) > MAX_STORE_BYTES:
        raise InvalidArgumentError(
            f"register.capabilities.store is at most {MAX_STORE_BYTES} bytes"
        )
    default = MODE_NAME.get(caps.default_mode) or OFFLOAD
    return Capabilities(modes, default, tuple(caps.tags), caps.store, caps.pipelined)


def command_message(command: Command) -> pb.AgentCommand:
    if command.kind == st.SNAPSHOT:
        snapshot = pb.SnapshotCommand(mode=_MODE[command.mode], tags=list(command.tags))
        return pb.AgentCommand(
            command.command_id, snapshot=snapshot, deadline_ms=command.deadline_ms
        )
    restore = pb.RestoreCommand(tags=list(command.tags))
    return pb.AgentCommand(command.command_id, restore=restore, deadline_ms=command.deadline_ms)


def operation_response(op: Operation) -> pb.GetOperationResponse:
    complete = op.status is OpStatus.COMPLETE
    status, error, elapsed_ms = _outcome(op)
    return pb.GetOperationResponse(
        status=status,
        storage_bytes=op.storage_bytes if complete else None,
        snapshot_device_bytes=op.device_bytes if complete else None,
        elapsed_ms=elapsed_ms,
        error=error,
        job_id=op.job,
        group=op.group,
        kind=op.kind,
        backend=op.backend,
    )


def _outcome(op: Operation) -> tuple[pb.OperationStatus, str | None, int]:
    """An operation's status, error (None unless it failed; cut to what a reader
    takes) and milliseconds so far."""
    end = op.finished if op.finished is not None else time.time()
    error = cap(op.error, MAX_TEXT_BYTES) if op.status is OpStatus.FAILED else None
    return _OP_STATUS[op.status], error, round((end - op.started) * 1000)
