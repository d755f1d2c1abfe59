"""The agent's records as the wire shows them: jobs, operations, switch steps,
workload commands and capabilities."""

from __future__ import annotations

import time
from typing import Final

from timeslice.agent import state as st
from timeslice.agent.channels import Capabilities, Command
from timeslice.agent.state import Job, JobState, Operation, OpStatus
from timeslice.agent.switching import SwitchStep
from timeslice.api.backend_config import MODE_NAME
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
    return pb.JobStatus(
        job_id=job.job,
        state=JOB_STATE[job.state],
        group=job.group,
        backend=job.backend,
        fault=job.fault,
        operation_id=job.operation,
        liveness=_LIVENESS[liveness],
        store=store,
    )


def switch_step(step: SwitchStep) -> pb.SwitchStep:
    op = step.op
    if op is None:
        return pb.SwitchStep(
            job_id=step.job,
            kind=step.kind,
            status=pb.OperationStatus.FAILED,
            error=step.error,
            refused=step.refused,
        )
    answer = operation_response(op)
    overlapped = round(step.overlap * 1000)
    return pb.SwitchStep(
        job_id=step.job,
        kind=step.kind,
        operation_id=op.op_id,
        status=answer.status,
        error=answer.error,
        storage_bytes=op.storage_bytes or 0,
        device_bytes=op.device_bytes or 0,
        elapsed_ms=max(0, answer.elapsed_ms - overlapped),
        overlapped_ms=overlapped,
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
    end = op.finished if op.finished is not None else time.time()
    complete = op.status is OpStatus.COMPLETE
    return pb.GetOperationResponse(
        status=_OP_STATUS[op.status],
        storage_bytes=op.storage_bytes if complete else None,
        snapshot_device_bytes=op.device_bytes if complete else None,
        elapsed_ms=round((end - op.started) * 1000),
        error=op.error if op.status is OpStatus.FAILED else None,
        job_id=op.job,
        group=op.group,
        kind=op.kind,
        backend=op.backend,
    )
