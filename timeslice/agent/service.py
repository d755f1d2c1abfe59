"""The agent's gRPC servicers: `SnapshotAgentService` and the standard health
service. Decode, call the Agent, encode; the edge is `edge_mapping`'s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import betterproto2
import grpclib.const
from grpclib.exceptions import GRPCError

from timeslice.agent import state as st
from timeslice.agent.access import (
    authorize_call,
    check_pids,
    is_trusted,
    may_replace_any,
    owner_of,
    refused,
    registrant,
)
from timeslice.agent.channels import Result, WorkloadChannel, WorkloadChannels
from timeslice.agent.config import AgentConfig
from timeslice.agent.messages import (
    JOB_STATE,
    capabilities_of,
    command_message,
    job_status,
    operation_response,
    switch_group_reply,
)
from timeslice.agent.state import Job, JobState
from timeslice.agent.switching import BackendChoice, SwitchHost, switch_group
from timeslice.api.backend_config import backend_of
from timeslice.api.health import HealthService as SharedHealthService
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.api.serving import CallGate, Encoded, edge_mapping
from timeslice.backends import AcceleratorMemory, Backend
from timeslice.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from timeslice.ids import check_id
from timeslice.kinds import Liveness, OpKind
from timeslice.security.callers import Caller
from timeslice.security.principals import DISCOVERY_REGISTRANT, Role, Verb
from timeslice.versions import package_version


class AgentApi(SwitchHost, Protocol):
    """What the servicers call: the `Agent`'s methods, read and act."""

    config: AgentConfig
    gate: CallGate
    backends: dict[str, Backend]
    channels: WorkloadChannels
    unavailable: dict[str, str]
    stopping: asyncio.Event

    @property
    def serving(self) -> bool: ...

    def liveness(self, job: Job) -> Liveness: ...

    async def check_token(
        self, group: str, token: int, proof: bytes = b"", *, epoch: int = 0
    ) -> None: ...

    async def reset(
        self, group: str, job: str, wait: float = 5.0, *, epoch: int = 0
    ) -> JobState: ...

    async def accelerators(self) -> list[AcceleratorMemory]: ...

    async def register(self, channel: WorkloadChannel, state: JobState) -> None: ...

    def unregister(self, channel: WorkloadChannel, reason: str, deregistered: bool) -> None: ...


log = logging.getLogger(__name__)

SERVICE_NAME = "snapshot_agent.v1alpha1.SnapshotAgentService"
DEREGISTERED = "the workload deregistered (it closed its channel)"


class AgentService(pb.SnapshotAgentServiceBase):
    """`SnapshotAgentService` over an `Agent`."""

    def __init__(self, agent: AgentApi) -> None:
        self.agent = agent

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return edge_mapping(super().__mapping__(), self, self.agent.gate)

    async def snapshot(self, message: pb.SnapshotRequest) -> pb.SnapshotResponse:
        op_id = await self._start(st.SNAPSHOT, message)
        return pb.SnapshotResponse(operation_id=op_id)

    async def restore(self, message: pb.RestoreRequest) -> pb.RestoreResponse:
        op_id = await self._start(st.RESTORE, message)
        return pb.RestoreResponse(operation_id=op_id)

    async def _start(self, kind: OpKind, message: pb.SnapshotRequest | pb.RestoreRequest) -> str:
        # A fencing token is the orchestrator's: nobody else may send one.
        verb = Verb.SWITCH if message.fencing_token else Verb.SNAPSHOT
        caller = authorize_call(verb, job=message.job_id, group=message.group)
        known = None if message.group else self.agent.table.find("", message.job_id)
        if known is not None and known.group:  # found by its id alone: its group counts
            authorize_call(verb, job=message.job_id, group=known.group)
        try:
            backend, config, params = backend_of(message.backend_config, message.backend)
        except PermissionDeniedError as exc:  # pid 1
            raise refused(caller, verb, exc.message) from None
        if message.timeout_ms is not None and message.timeout_ms <= 0:
            raise InvalidArgumentError("timeout_ms must be positive")
        self._check_owned(caller, message.group, message.job_id, backend, config)
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
        authorize_call(Verb.SNAPSHOT)
        found = self.agent.table.operations.get(message.operation_id)
        if found is not None:  # else NOT_FOUND below, as for anyone
            authorize_call(Verb.SNAPSHOT, job=found.job, group=found.group)
        op = await self.agent.operation(message.operation_id, wait / 1000)
        return operation_response(op)

    async def status(self, message: pb.StatusRequest) -> pb.StatusResponse:
        caller = authorize_call(Verb.AGENT_STATUS)
        jobs = [
            job_status(job, self.agent.liveness(job), self._store_of(job))
            for job in self.agent.table.jobs.values()
            if _sees(caller, job)
        ]
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
            version=package_version(),
        )

    # Its answer is encoded by hand (`timeslice.api.hot`), and sent by the edge as it is.
    async def switch_group(self, message: pb.SwitchGroupRequest) -> Encoded:  # type: ignore[override]
        authorize_call(Verb.SWITCH, group=message.group)
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
                backend, config, params = backend_of(job.backend_config, pb.Backend.UNSPECIFIED)
                choice = BackendChoice(
                    backend=backend,
                    config=config,
                    params=params,
                    refusal=self._refusal(message.group, job, backend, config),
                )
            jobs[job.job_id] = choice
            if job.snapshot_timeout_ms < 0:
                raise InvalidArgumentError("snapshot_timeout_ms must not be negative")
            if job.snapshot_timeout_ms:
                snapshot_limits[job.job_id] = job.snapshot_timeout_ms / 1000
        epoch = message.orchestrator_epoch
        await self.agent.check_token(
            message.group, message.fencing_token, message.token_proof, epoch=epoch
        )
        report = await switch_group(
            self.agent,
            message.group,
            message.next_job_id,
            message.fencing_token,
            message.timeout_ms / 1000,
            jobs,
            snapshot_limits,
            epoch=epoch,
        )
        table = self.agent.table
        return Encoded.of_body(
            switch_group_reply(
                report,
                self.agent.config.node_name,
                [job for job in table.jobs.values() if job.group == message.group],
                table.version,
                self.agent.liveness,
            )
        )

    async def reset_job(self, message: pb.ResetJobRequest) -> pb.ResetJobResponse:
        authorize_call(Verb.RESET_JOB, job=message.job_id, group=message.group)
        state = await self.agent.reset(
            message.group, message.job_id, epoch=message.orchestrator_epoch
        )
        return pb.ResetJobResponse(state=JOB_STATE[state], table_version=self.agent.table.version)

    async def workload_channel(
        self, messages: AsyncIterator[pb.WorkloadMessage]
    ) -> AsyncIterator[pb.AgentCommand]:
        first = await anext(messages, None)
        kind, register = betterproto2.which_one_of(first, "message") if first else ("", None)
        if kind != "register" or not isinstance(register, pb.RegisterWorkload):
            raise InvalidArgumentError("the first WorkloadChannel message must be `register`")
        caller = authorize_call(Verb.WORKLOAD_CHANNEL, job=register.job_id, group=register.group)
        # A job of another user's processes is not taken over by a channel either.
        self._check_owned(caller, register.group, register.job_id, None, None)
        channel = WorkloadChannel(register.group, register.job_id, capabilities_of(register))
        channel.owner, channel.owner_trusted = owner_of(caller), may_replace_any(caller)
        channel.peer = caller.who
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
            # A goodbye in the middle of a command is no goodbye: where the context
            # is, nobody knows, whether or not the operation has failed already.
            goodbye = reason == DEREGISTERED and not channel.interrupted
            self.agent.unregister(channel, reason, deregistered=goodbye)

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
                answer = Result(
                    command_id=result.command_id,
                    ok=result.ok,
                    error=result.error,
                    storage_bytes=result.storage_bytes,
                    device_bytes=result.device_bytes,
                )
                if not channel.deliver(answer):
                    log.info("%s answered %s after its deadline", channel.job, result.command_id)
        except GRPCError as exc:  # a message the edge refused (too large, malformed)
            reason, channel.failure = f"the workload channel failed: {exc.message}", exc
        except Exception as exc:
            reason = f"the workload channel failed: {exc}"
        channel.close(reason or DEREGISTERED)

    def _store_of(self, job: Job) -> str:
        """Where the job's workload said it keeps an offloaded context, over the
        channel open now; "" for a job of another backend or with no channel."""
        if job.backend != "app_channel":
            return ""
        channel = self.agent.channels.get(job.group, job.job)
        return channel.capabilities.store if channel is not None else ""

    def _refusal(
        self, group: str, job: pb.SwitchJob, backend: str | None, config: dict[str, object] | None
    ) -> str:
        """Why the agent may not act on the backend `job` registered with the
        orchestrator ("" it may): checked as its registrant, before the agent
        first knows the job (a job it knows keeps the backend it is known by)."""
        if self.agent.table.find(group, job.job_id) is not None:
            return ""
        if job.registered_by:
            check_id("registered_by", job.registered_by)
        caller = registrant(self.agent.gate.authenticator.policy, job.registered_by)
        # The orchestrator's own discovery (this SwitchGroup is an operator's) may
        # name a pod; no caller's principal has that name.
        discovered = job.registered_by == DISCOVERY_REGISTRANT
        try:
            self._check_owned(caller, group, job.job_id, backend, config, may_name_pod=discovered)
        except PermissionDeniedError as exc:
            return exc.message
        except NotFoundError:
            return ""  # no such process: its operation fails, faulting the job
        return ""

    def _check_owned(
        self,
        caller: Caller,
        group: str,
        job: str,
        backend: str | None,
        config: dict[str, object] | None,
        *,
        may_name_pod: bool = False,
    ) -> None:
        """Refuse an operation on what the caller's user does not own: the processes
        of a `cuda` job (named now or when the job became known; a pod's, only for a
        trusted caller or the orchestrator's discovery), the workload channel of an
        `app_channel` job."""
        if is_trusted(caller):
            return
        known = self.agent.table.find(group, job)
        if known is not None:
            backend, config = known.backend, dict(known.config)
        if backend == "cuda" and config is not None and "pod_uid" in config and not may_name_pod:
            raise refused(
                caller,
                Verb.SNAPSHOT,
                f"only an operator, or the orchestrator's discovery, may name a pod ({job})",
            )
        if backend == "cuda" and config is not None:
            pids = config.get("pids")
            if isinstance(pids, list | tuple):
                check_pids(caller, [p for p in pids if isinstance(p, int)])
        if known is not None and known.backend == "app_channel":
            channel = self.agent.channels.get(known.group, known.job)
            if channel is not None and channel.owner != owner_of(caller):
                raise refused(
                    caller,
                    Verb.SNAPSHOT,
                    f"the workload channel of {job} belongs to another user",
                )


def _sees(caller: Caller, job: Job) -> bool:
    """Whether the caller's status shows `job`: a job principal's own jobs, a
    viewer's groups; everything to an operator and to callers without a principal."""
    principal = caller.principal
    if principal is None or principal.role is Role.OPERATOR:
        return True
    if principal.role is Role.JOB and not principal.may_act_as(job.job):
        return False
    return principal.may_touch(job.group)


class HealthService(SharedHealthService):
    """The standard health service: SERVING while the agent serves; a backend's name
    as the service asks whether that backend is available."""

    def __init__(self, agent: AgentApi) -> None:
        self.agent = agent
        super().__init__(agent.gate, agent.stopping, self._serving)

    def _serving(self, service: str) -> bool:
        if service not in ("", SERVICE_NAME) and service not in self.agent.backends:
            if service not in self.agent.unavailable:
                raise NotFoundError(f"unknown service {service!r}")
            return False
        return self.agent.serving
