"""What a hostile or careless caller sends cannot hold a server up: ids of any
length are refused at once, with a short message; conflicting oneof members and
cut frames are INVALID_ARGUMENT, never INTERNAL."""

from __future__ import annotations

import asyncio
import time

import grpclib.client
import pytest
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from orchestrator_wire import PassThroughCodec, split_address

from timeslice import Agent, Orchestrator
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as opb

pytestmark = pytest.mark.timeout(60)

AGENT = "/snapshot_agent.v1alpha1.SnapshotAgentService"
ORCHESTRATOR = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService"


async def send(address: str, route: str, data: bytes, *, framed: bool = True) -> GRPCError | bytes:
    """Send `data` as the request of unary `route` (as raw bytes after the stream's
    headers when not `framed`); the error it was answered with, or the answer."""
    host, port = split_address(address)
    channel = grpclib.client.Channel(host, port, codec=PassThroughCodec())
    try:
        async with channel.request(
            route, Cardinality.UNARY_UNARY, bytes, bytes, timeout=10
        ) as stream:
            await stream.send_request()
            if framed:
                await stream.send_message(data, end=True)
            else:
                await stream._stream.send_data(data, end_stream=True)
                stream._end_done = True  # ended on the wire, behind grpclib's back
            try:
                answer = await stream.recv_message()
            except GRPCError as error:
                return error
            assert answer is not None
            return answer
    finally:
        channel.close()


async def refused(address: str, route: str, data: bytes, **kw: bool) -> GRPCError:
    started = time.monotonic()
    answer = await send(address, route, data, **kw)
    assert isinstance(answer, GRPCError), answer
    assert time.monotonic() - started < 2.0
    assert len(answer.message or "") <= 1024
    return answer


async def test_long_ids_are_refused_at_once_with_a_short_message() -> None:
    async with Orchestrator() as orch, Agent(node_name="n1", backends=("noop",)) as agent:
        long_op = bytes(apb.GetOperationRequest(operation_id="o" * 400_000))
        error = await refused(agent.address, f"{AGENT}/GetOperation", long_op)
        assert error.status is Status.INVALID_ARGUMENT
        long_request = bytes(opb.AcquireRequest(job_id="j", group_id="g", request_id="r" * 200_000))
        error = await refused(orch.address, f"{ORCHESTRATOR}/Acquire", long_request)
        assert error.status is Status.INVALID_ARGUMENT
        assert "request_id" in (error.message or "")
        long_backend = bytes(
            apb.SnapshotRequest(
                job_id="j",
                backend_config=apb.BackendConfig(named=apb.NamedBackendConfig(name="n" * 100_000)),
            )
        )
        error = await refused(agent.address, f"{AGENT}/Snapshot", long_backend)
        assert error.status is Status.INVALID_ARGUMENT
        assert orch.table.groups == {} and agent.table.jobs == {}


async def test_two_members_of_a_oneof_and_cut_frames_are_invalid_arguments() -> None:
    async with Agent(node_name="n1", backends=("noop",)) as agent:
        both = bytes(apb.BackendConfig(cuda=apb.CudaBackendConfig())) + bytes(
            apb.BackendConfig(named=apb.NamedBackendConfig(name="noop"))
        )
        request = bytes(apb.SnapshotRequest(job_id="j")) + b"\x22" + bytes([len(both)]) + both
        error = await refused(agent.address, f"{AGENT}/Snapshot", request)
        assert error.status is Status.INVALID_ARGUMENT
        for cut in (b"\x00\x00\x00", b"\x00\x00\x00\x00\x09abc"):
            error = await refused(agent.address, f"{AGENT}/Status", cut, framed=False)
            assert error.status is Status.INVALID_ARGUMENT, error
        assert agent.table.jobs == {}


@pytest.mark.parametrize("http2", ["grpclib", "h2core"])
async def test_the_orchestrator_refuses_long_ids_and_cut_frames_on_either_server(
    http2: str,
) -> None:
    async with Orchestrator(http2=http2) as orch:
        route = f"{ORCHESTRATOR}/Acquire"
        long_request = bytes(opb.AcquireRequest(job_id="j", group_id="g", request_id="r" * 200_000))
        error = await refused(orch.address, route, long_request)
        assert error.status is Status.INVALID_ARGUMENT
        assert "request_id" in (error.message or "")
        for cut in (b"\x00\x00\x00", b"\x00\x00\x00\x00\x09abc"):
            error = await refused(orch.address, route, cut, framed=False)
            assert error.status is Status.INVALID_ARGUMENT, error
        garbage = b"\xff" * 20  # not a message of any kind
        error = await refused(orch.address, route, garbage)
        assert error.status is Status.INVALID_ARGUMENT, error
        assert orch.table.groups == {}


@pytest.mark.parametrize("http2", ["grpclib", "h2core"])
async def test_new_groups_and_waiters_over_the_limits_are_resource_exhausted(http2: str) -> None:
    async with Orchestrator(max_groups=1, max_waiters_per_group=1, http2=http2) as orch:
        route = f"{ORCHESTRATOR}/Acquire"
        assert not isinstance(
            await send(orch.address, route, bytes(opb.AcquireRequest(job_id="a", group_id="g"))),
            GRPCError,
        )
        other = bytes(opb.AcquireRequest(job_id="a", group_id="h"))
        assert (await refused(orch.address, route, other)).status is Status.RESOURCE_EXHAUSTED
        waiter = bytes(opb.AcquireRequest(job_id="b", group_id="g", wait_timeout_ms=5000))
        waiting = asyncio.ensure_future(send(orch.address, route, waiter))
        while "b" not in orch.table.groups["g"].queue:
            await asyncio.sleep(0.01)
        third = bytes(opb.AcquireRequest(job_id="c", group_id="g"))
        assert (await refused(orch.address, route, third)).status is Status.RESOURCE_EXHAUSTED
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
