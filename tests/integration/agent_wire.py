"""Helpers for tests that talk to an Agent over real gRPC with the generated
grpclib stubs (not the timeslice client): snapshot and restore requests, waiting
on operations, reading job states, raw request bytes, and a workload that speaks
the WorkloadChannel stream message by message."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpclib.client
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from h2.exceptions import ProtocolError as H2ProtocolError
from orchestrator_wire import PassThroughCodec, split_address

from tests.waiting import until
from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client.workload import WorkloadRegistration, register_workload

if TYPE_CHECKING:
    from timeslice.agent.server import Agent

SERVICE = "/snapshot_agent.v1alpha1.SnapshotAgentService"
# Every call made through these helpers ends within this many seconds.
CALL_TIMEOUT = 10.0
MiB = 1024 * 1024

JobState = pb.JobState
OpStatus = pb.OperationStatus

NOOP = pb.BackendConfig(named=pb.NamedBackendConfig(name="noop"))


def app_channel(mode: pb.SuspendMode = pb.SuspendMode.UNSPECIFIED, *tags: str) -> pb.BackendConfig:
    return pb.BackendConfig(app_channel=pb.AppChannelConfig(mode=mode, tags=list(tags)))


APP_CHANNEL = app_channel()


def snapshot(job: str, group: str = "", backend: pb.BackendConfig | None = None,
             **extensions: Any) -> pb.SnapshotRequest:  # fmt: skip
    return pb.SnapshotRequest(job_id=job, group=group, backend_config=backend, **extensions)


def restore(job: str, group: str = "", backend: pb.BackendConfig | None = None,
            **extensions: Any) -> pb.RestoreRequest:  # fmt: skip
    return pb.RestoreRequest(job_id=job, group=group, backend_config=backend, **extensions)


@dataclass
class AgentStubs:
    """The agent's service and the health service, on one channel."""

    agent: pb.SnapshotAgentServiceStub
    health: health.HealthStub
    channel: grpclib.client.Channel


@asynccontextmanager
async def agent_stubs(address: str, timeout: float = CALL_TIMEOUT) -> AsyncIterator[AgentStubs]:
    """Generated stubs on their own channel, closed on exit."""
    host, port = split_address(address)
    channel = grpclib.client.Channel(host, port)
    try:
        yield AgentStubs(
            pb.SnapshotAgentServiceStub(channel, timeout=timeout),
            health.HealthStub(channel, timeout=timeout),
            channel,
        )
    finally:
        channel.close()


async def finish_operation(
    stub: pb.SnapshotAgentServiceStub, op_id: str, timeout: float = 10.0
) -> pb.GetOperationResponse:
    """GetOperation with a server-side wait, repeated until the operation has ended."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        wait_ms = max(1, min(2000, int(left * 1000)))
        answer = await stub.get_operation(
            pb.GetOperationRequest(operation_id=op_id, wait_ms=wait_ms), timeout=wait_ms / 1000 + 5
        )
        if answer.status is not OpStatus.PENDING:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"operation {op_id} still pending after {timeout} s: {answer}")


async def run_operation(
    stub: pb.SnapshotAgentServiceStub, request: pb.SnapshotRequest | pb.RestoreRequest,
    timeout: float = 10.0,
) -> pb.GetOperationResponse:  # fmt: skip
    """Start a snapshot or restore and wait until it has ended."""
    if isinstance(request, pb.SnapshotRequest):
        op_id = (await stub.snapshot(request)).operation_id
    else:
        op_id = (await stub.restore(request)).operation_id
    return await finish_operation(stub, op_id, timeout)


async def jobs(stub: pb.SnapshotAgentServiceStub) -> dict[str, pb.JobStatus]:
    """Every job the agent reports, by job id."""
    return {job.job_id: job for job in (await stub.status()).job_statuses}


async def states(stub: pb.SnapshotAgentServiceStub) -> dict[str, pb.JobState]:
    """Every job's state, by job id."""
    return {job: status.state for job, status in (await jobs(stub)).items()}


async def everything(stub: pb.SnapshotAgentServiceStub) -> list[tuple[Any, ...]]:
    """Every job's whole Status entry, comparable with ==."""
    return sorted(
        (j.group, j.job_id, j.state, j.backend, j.fault, j.operation_id)
        for j in (await stub.status()).job_statuses
    )


async def wait_for_job(
    stub: pb.SnapshotAgentServiceStub,
    job: str,
    check: Callable[[pb.JobStatus], bool],
    timeout: float = 5.0,
) -> pb.JobStatus:
    """Poll Status until job `job` satisfies `check`; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = (await jobs(stub)).get(job)
        if found is not None and check(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} never reached the expected state; last: {found}")
        await asyncio.sleep(0.01)


async def wait_until_forgotten(
    stub: pb.SnapshotAgentServiceStub, job: str, timeout: float = 5.0
) -> None:
    """Poll Status until job `job` is no longer listed; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (found := (await jobs(stub)).get(job)) is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} is still listed: {found}")
        await asyncio.sleep(0.01)


async def grpc_error(call: Any) -> GRPCError:
    """The error a call fails with (AssertionError if it succeeds)."""
    try:
        answer = await call
    except GRPCError as exc:
        return exc
    raise AssertionError(f"the call succeeded: {answer!r}")


async def call_raw(
    address: str, method: str, payload: bytes, timeout: float = CALL_TIMEOUT
) -> bytes:
    """Send `payload` as the request body of unary `method` of the agent service;
    return the raw answer. The request is sent while the answer is read, so that a
    server that refuses a large request early answers instead of stalling the sender."""
    host, port = split_address(address)
    channel = grpclib.client.Channel(host, port, codec=PassThroughCodec())
    try:
        async with channel.request(
            f"{SERVICE}/{method}", Cardinality.UNARY_UNARY, bytes, bytes, timeout=timeout
        ) as stream:
            await stream.send_request()
            sending = asyncio.ensure_future(stream.send_message(payload, end=True))
            try:
                answer = await stream.recv_message()
            finally:
                if not sending.done():
                    sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
        assert answer is not None
        return answer
    finally:
        channel.close()


async def workload_channel_raw(
    address: str, payloads: list[bytes], end: bool = False, timeout: float = CALL_TIMEOUT
) -> list[bytes]:
    """Open a WorkloadChannel, send `payloads` as the stream's messages (raw bytes),
    end the sending side if `end` (else keep it open), and return the commands
    received until the agent ends the stream."""
    host, port = split_address(address)
    channel = grpclib.client.Channel(host, port, codec=PassThroughCodec())
    received: list[bytes] = []
    try:
        async with channel.request(
            f"{SERVICE}/WorkloadChannel", Cardinality.STREAM_STREAM, bytes, bytes, timeout=timeout
        ) as stream:
            await stream.send_request()

            async def send() -> None:
                for payload in payloads:
                    await stream.send_message(payload)
                if end:
                    await stream.end()

            sending = asyncio.ensure_future(send())
            try:
                while (message := await stream.recv_message()) is not None:
                    received.append(message)
                await stream.recv_trailing_metadata()
            finally:
                if not sending.done():
                    sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
        return received
    finally:
        channel.close()


class Workload:
    """A workload on the WorkloadChannel, driven by the test one message at a time."""

    def __init__(self, stream: grpclib.client.Stream[Any, Any], job: str, group: str) -> None:
        self.stream = stream
        self.job, self.group = job, group

    async def command(self, timeout: float = 5.0) -> pb.AgentCommand:
        """The next command the agent sends."""
        command = await asyncio.wait_for(self.stream.recv_message(), timeout)
        assert command is not None, "the agent ended the workload channel"
        return command

    async def answer(
        self, command: pb.AgentCommand, ok: bool = True, error: str = "",
        storage_bytes: int | None = None, device_bytes: int | None = None,
    ) -> None:  # fmt: skip
        result = pb.CommandResult(
            command_id=command.command_id, ok=ok, error=error,
            storage_bytes=storage_bytes, device_bytes=device_bytes,
        )  # fmt: skip
        await self.stream.send_message(pb.WorkloadMessage(result=result))

    async def serve(self, count: int, storage_bytes: int = 0, device_bytes: int = 0) -> list[str]:
        """Answer the next `count` commands with success; return their kinds."""
        kinds = []
        for _ in range(count):
            command = await self.command()
            kinds.append("snapshot" if command.snapshot is not None else "restore")
            await self.answer(command, storage_bytes=storage_bytes, device_bytes=device_bytes)
        return kinds

    async def cut(self) -> None:
        """Reset the stream, as when the workload's process dies."""
        await self.stream.cancel()

    async def ended(self, timeout: float = 5.0) -> GRPCError | StreamTerminatedError | None:
        """Wait until the agent ends the stream; the error it ended with (or the lost
        connection), if any."""
        try:
            message = await asyncio.wait_for(self.stream.recv_message(), timeout)
            assert message is None, f"a command came instead of the end: {message}"
            with suppress(*STREAM_ENDED):
                await self.stream.end()  # grpclib reads the status only once both sides end
            await asyncio.wait_for(self.stream.recv_trailing_metadata(), timeout)
        except GRPCError as exc:
            return exc
        except StreamTerminatedError as exc:
            # grpclib raises this for every read once the connection is gone, even when
            # the stream's status arrived before: a server that ends its streams and
            # then closes is told apart from one that cuts them off by that status.
            # (A stream that ends before any command answers "trailers-only": the status
            # then comes in the headers.)
            raw = self.stream._stream
            trailers = dict(raw.trailers or ()) or dict(raw.headers or ())
            if "grpc-status" not in trailers:
                return exc
            status = Status(int(trailers["grpc-status"]))
            if status is not Status.OK:
                return GRPCError(status, trailers.get("grpc-message"))
        return None


@asynccontextmanager
async def workload(
    address: str,
    job: str,
    group: str = "",
    *,
    state: pb.JobState = JobState.UNSPECIFIED,
    capabilities: pb.WorkloadCapabilities | None = None,
    timeout: float = 60.0,
) -> AsyncIterator[Workload]:
    """Register `job` over a WorkloadChannel of its own; wait until the agent lists it.
    On exit the workload ends its side of the stream and waits for the agent to end
    the other (a stream the agent has ended already, or cut, is fine)."""
    host, port = split_address(address)
    channel = grpclib.client.Channel(host, port)
    body_done = False
    try:
        async with channel.request(
            f"{SERVICE}/WorkloadChannel",
            Cardinality.STREAM_STREAM,
            pb.WorkloadMessage,
            pb.AgentCommand,
            timeout=timeout,
        ) as stream:
            register = pb.RegisterWorkload(
                job_id=job, group=group, capabilities=capabilities, state=state
            )
            await stream.send_message(pb.WorkloadMessage(register=register))
            stub = pb.SnapshotAgentServiceStub(channel, timeout=CALL_TIMEOUT)
            expected = JobState.SAVED if state == JobState.SAVED else JobState.RUNNING
            await wait_for_job(
                stub, job, lambda s: s.backend == "app_channel" and s.state == expected
            )
            yield Workload(stream, job, group)
            body_done = True
            await _close_stream(stream)
    except STREAM_ENDED:
        if not body_done:
            raise
    finally:
        channel.close()


# What ending a stream can raise once the other side has ended it or gone away.
STREAM_ENDED = (GRPCError, StreamTerminatedError, ProtocolError, H2ProtocolError, OSError,
                TimeoutError)  # fmt: skip


async def _close_stream(stream: grpclib.client.Stream[Any, Any]) -> None:
    with suppress(*STREAM_ENDED):
        await stream.end()
    with suppress(*STREAM_ENDED):
        while await asyncio.wait_for(stream.recv_message(), 5) is not None:
            pass
        await asyncio.wait_for(stream.recv_trailing_metadata(), 5)


async def health_status(stubs: AgentStubs, service: str = "") -> Status | Any:
    """The health Check answer's status for `service`, or the gRPC status it fails with."""
    try:
        answer = await stubs.health.check(health.HealthCheckRequest(service=service))
    except GRPCError as exc:
        return exc.status
    return answer.status


@asynccontextmanager
async def registered(
    agent: Agent, job: str, group: str = "g", **workload: Any
) -> AsyncIterator[WorkloadRegistration]:
    """A workload registered with `agent` over the workload channel (once the agent
    has it), deregistered on exit."""
    registration = await register_workload(
        agent.address, job, group, connect_timeout_sec=5, **workload
    )
    try:
        await until(lambda: agent.channels.get(group, job) is not None, f"{job} registered")
        yield registration
    finally:
        await registration.close()
