"""The agent's gRPC servicers: `SnapshotAgentService` and the standard health
service. Decode, call the Agent, encode; the edge is `edge_mapping`'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import betterproto2
import grpclib.const
from grpclib.exceptions import GRPCError

from timeslice.agent import state as st
from timeslice.agent.channels import Capabilities, Command, Result, WorkloadChannel
from timeslice.agent.state import Job, JobState, Operation, OpStatus
from timeslice.agent.switching import BackendChoice, SwitchStep, switch_group
from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.api.serving import edge_mapping
from timeslice.api.backend_config import MODE_NAME, backend_of
from timeslice.backends import DISCARD, OFFLOAD
from timeslice.errors import InvalidArgumentError, NotFoundError
from timeslice.orchestrator.model import check_id

if TYPE_CHECKING:
    from timeslice.agent.server import Agent

log = logging.getLogger(__name__)

SERVICE_NAME = "snapshot_agent.v1alpha1.SnapshotAgentService"
DEREGISTERED = "the workload deregistered (it closed its channel)"

_MODE = {OFFLOAD: pb.SuspendMode.OFFLOAD, DISCARD: pb.SuspendMode.DISCARD}
_JOB_STATE = {state: pb.JobState[state.value] for state in JobState}
_OP_STATUS = {status: pb.OperationStatus[status.value] for status in OpStatus}


class AgentService(pb.SnapshotAgentServiceBase):
    """`SnapshotAgentService` over an `Agent`."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return edge_mapping(super().__mapping__(), self, self.agent.gate)

    async def snapshot(self, message: pb.SnapshotRequest) -> pb.SnapshotResponse:
        op_id = await self._start(st.SNAPSHOT, message)
        return pb.SnapshotResponse(operation_id=op_id)

    async def restore(self, message: pb.RestoreRequest) -> pb.RestoreResponse:
        op_id = await self._start(st.RESTORE, message)
        return pb.RestoreResponse(operation_id=op_id)

    async def _start(self, kind: str, message: pb.SnapshotRequest | pb.RestoreRequest) -> str:
        backend, config, params = backend_of(message.backend_config, message.backend)
        if message.timeout_ms is not None and message.timeout_ms <= 0:
            raise InvalidArgumentError("timeout_ms must be positive")
        return await self.agent.start_operation(
            kind,
            message.group,
            message.job_id,
            backend=backend,
            config=config,
            params=params,
            token=message.fencing_token,
            timeout=message.timeout_ms / 1000 if message.timeout_ms else None,
        )

    async def get_operation(self, message: pb.GetOperationRequest) -> pb.GetOperationResponse:
        if not message.operation_id:
            raise InvalidArgumentError("operation_id must not be empty")
        wait = message.wait_ms or 0
        if wait < 0:
            raise InvalidArgumentError("wait_ms must not be negative")
        op = await self.agent.operation(message.operation_id, wait / 1000)
        return operation_response(op)

    async def status(self, message: pb.StatusRequest) -> pb.StatusResponse:
        jobs = [job_status(job, self.agent.liveness(job)) for job in self.agent.table.jobs.values()]
        accelerators = [
            pb.AcceleratorStatus(
                id=m.id, memory_used_bytes=m.used_bytes, memory_total_bytes=m.total_bytes
            )
            for m in await self.agent.accelerators()
        ]
        return pb.StatusResponse(
            job_statuses=jobs,
            accelerator_statuses=accelerators,
            node_name=self.agent.config.node_name,
        )

    async def switch_group(self, message: pb.SwitchGroupRequest) -> pb.SwitchGroupResponse:
        check_id("group", message.group)
        if message.next_job_id:
            check_id("next_job_id", message.next_job_id)
        if message.timeout_ms <= 0:
            raise InvalidArgumentError("timeout_ms must be positive")
        jobs: dict[str, BackendChoice | None] = {}
        snapshot_limits: dict[str, float] = {}
        for job in message.jobs:
            check_id("job_id", job.job_id)
            choice = None
            if job.backend_config is not None:
                choice = BackendChoice(*backend_of(job.backend_config, pb.Backend.UNSPECIFIED))
            jobs[job.job_id] = choice
            if job.snapshot_timeout_ms < 0:
                raise InvalidArgumentError("snapshot_timeout_ms must not be negative")
            if job.snapshot_timeout_ms:
                snapshot_limits[job.job_id] = job.snapshot_timeout_ms / 1000
        await self.agent.check_token(message.group, message.fencing_token, message.token_proof)
        report = await switch_group(
            self.agent,
            message.group,
            message.next_job_id,
            message.fencing_token,
            message.timeout_ms / 1000,
            jobs,
            snapshot_limits,
        )
        return pb.SwitchGroupResponse(
            steps=[_switch_step(step) for step in report.steps],
            restored=report.restored,
            next_state=_JOB_STATE[report.next_state]
            if report.next_state
            else pb.JobState.UNSPECIFIED,
            faulted=[job_status(job, self.agent.liveness(job)) for job in report.faulted],
            node_name=self.agent.config.node_name,
        )

    async def reset_job(self, message: pb.ResetJobRequest) -> pb.ResetJobResponse:
        state = await self.agent.reset(message.group, message.job_id)
        return pb.ResetJobResponse(state=_JOB_STATE[state])

    async def workload_channel(
        self, messages: AsyncIterator[pb.WorkloadMessage]
    ) -> AsyncIterator[pb.AgentCommand]:
        first = await anext(messages, None)
        kind, register = betterproto2.which_one_of(first, "message") if first else ("", None)
        if kind != "register" or not isinstance(register, pb.RegisterWorkload):
            raise InvalidArgumentError("the first WorkloadChannel message must be `register`")
        channel = WorkloadChannel(register.group, register.job_id, capabilities_of(register))
        state = JobState.SAVED if register.state == pb.JobState.SAVED else JobState.RUNNING
        if register.state not in (pb.JobState.UNSPECIFIED, pb.JobState.RUNNING, pb.JobState.SAVED):
            raise InvalidArgumentError("a workload registers as RUNNING or SAVED")
        reader: asyncio.Future[None] | None = None
        try:
            # Inside the try: a stream that ends while the registration is being saved
            # still unregisters the channel (which `register` attached at once).
            await self.agent.register(channel, state)
            reader = asyncio.ensure_future(self._read_results(channel, messages))
            while (command := await channel.outbox.get()) is not None:
                yield command_message(command)
            if channel.failure is not None:
                raise channel.failure
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            reason = channel.closed or "the workload channel closed"
            self.agent.unregister(channel, reason, deregistered=reason == DEREGISTERED)

    async def _read_results(
        self, channel: WorkloadChannel, messages: AsyncIterator[pb.WorkloadMessage]
    ) -> None:
        reason = ""  # a stream the workload ends cleanly: it deregistered
        try:
            async for message in messages:
                kind, result = betterproto2.which_one_of(message, "message")
                if kind != "result" or not isinstance(result, pb.CommandResult):
                    reason = "the workload sent something other than a command result"
                    channel.failure = InvalidArgumentError(
                        f"after `register`, a workload sends only command results, not {kind!r}"
                    )
                    break
                answer = Result(result.command_id, result.ok, result.error,
                                result.storage_bytes, result.device_bytes)  # fmt: skip
                if not channel.deliver(answer):
                    log.info("%s answered %s after its deadline", channel.job, result.command_id)
        except GRPCError as exc:  # a message the edge refused (too large, malformed)
            reason, channel.failure = f"the workload channel failed: {exc.message}", exc
        except Exception as exc:
            reason = f"the workload channel failed: {exc}"
        channel.close(reason or DEREGISTERED)


_LIVENESS = {"": pb.Liveness.UNSPECIFIED, "ALIVE": pb.Liveness.ALIVE, "GONE": pb.Liveness.GONE}


def job_status(job: Job, liveness: str) -> pb.JobStatus:
    """A job of the table as the wire shows it."""
    return pb.JobStatus(
        job_id=job.job,
        state=_JOB_STATE[job.state],
        group=job.group,
        backend=job.backend,
        fault=job.fault,
        operation_id=job.operation,
        liveness=_LIVENESS[liveness],
    )


def _switch_step(step: SwitchStep) -> pb.SwitchStep:
    op = step.op
    if op is None:
        return pb.SwitchStep(job_id=step.job, kind=step.kind, status=pb.OperationStatus.FAILED,
                             error=step.error)  # fmt: skip
    answer = operation_response(op)
    return pb.SwitchStep(
        job_id=step.job,
        kind=step.kind,
        operation_id=op.op_id,
        status=answer.status,
        error=answer.error,
        storage_bytes=op.storage_bytes or 0,
        device_bytes=op.device_bytes or 0,
        elapsed_ms=answer.elapsed_ms,
    )


def capabilities_of(register: pb.RegisterWorkload) -> Capabilities:
    if not register.job_id:
        raise InvalidArgumentError("register.job_id must not be empty")
    caps = register.capabilities or pb.WorkloadCapabilities()
    modes = tuple(MODE_NAME[m] for m in caps.supported_modes if MODE_NAME.get(m))
    return Capabilities(modes, MODE_NAME.get(caps.default_mode) or OFFLOAD, tuple(caps.tags))


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


class HealthService(health.HealthBase):
    """The standard health service: SERVING while the agent serves; a backend's name
    as the service asks whether that backend is available."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return edge_mapping(super().__mapping__(), self, self.agent.gate)

    def _status(self, service: str) -> health.HealthCheckResponseServingStatus:
        if service not in ("", SERVICE_NAME) and service not in self.agent.backends:
            if service not in self.agent.unavailable:
                raise NotFoundError(f"unknown service {service!r}")
            return health.HealthCheckResponseServingStatus.NOT_SERVING
        serving = self.agent.serving
        return (health.HealthCheckResponseServingStatus.SERVING if serving
                else health.HealthCheckResponseServingStatus.NOT_SERVING)  # fmt: skip

    async def check(self, message: health.HealthCheckRequest) -> health.HealthCheckResponse:
        return health.HealthCheckResponse(status=self._status(message.service))

    async def watch(
        self, message: health.HealthCheckRequest
    ) -> AsyncIterator[health.HealthCheckResponse]:
        """The status now, then NOT_SERVING when the agent starts closing (the stream
        ends then, as the agent stops)."""
        status = self._status(message.service)
        yield health.HealthCheckResponse(status=status)
        await self.agent.stopping.wait()
        if status != health.HealthCheckResponseServingStatus.NOT_SERVING:
            yield health.HealthCheckResponse(
                status=health.HealthCheckResponseServingStatus.NOT_SERVING
            )
