"""The clients read the answers of a cycle and of a switch as strictly as a server reads
a request: a malformed one is an error of its own, never a half-read answer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpclib.const
import pytest
from grpclib.server import Server, Stream

from timeslice.api import hot
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client import AsyncSnapshotAgentClient, AsyncTimeSliceOrchestratorClient
from timeslice.errors import InternalError

ROUTE = "/snapshot_agent.v1alpha1.SnapshotAgentService/SwitchGroup"
ACQUIRE = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/Acquire"
MALFORMED = [
    b"\x0a\x05ab",  # a step cut short
    b"\x0a\x02\x08\x01",  # a step whose job id is a number
    b"\x2a\x02\xff\xfe",  # a node name that is not UTF-8
]
MALFORMED_IDS = ["truncated", "wrong wire type", "not UTF-8"]


class FakeServer:
    """Answers every call of `route` (an agent's SwitchGroup, or an orchestrator's
    Acquire) with `answer`, and keeps the SwitchGroup requests it was sent."""

    def __init__(self, answer: bytes, route: str = ROUTE) -> None:
        self.answer, self.route = answer, route
        self.requests: list[apb.SwitchGroupRequest] = []

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            self.route: grpclib.const.Handler(
                self.answer_call,
                grpclib.const.Cardinality.UNARY_UNARY,
                hot.Prepared,
                hot.Prepared,
            )
        }

    async def answer_call(self, stream: Stream[hot.Prepared, hot.Prepared]) -> None:
        request = await stream.recv_message()
        assert request is not None
        if self.route == ROUTE:
            self.requests.append(apb.SwitchGroupRequest.FromString(request.data))
        await stream.send_message(hot.Prepared(self.answer))


@pytest.fixture
async def serve() -> AsyncIterator[list[Server]]:
    servers: list[Server] = []
    yield servers
    for server in servers:
        server.close()
        await server.wait_closed()


async def start(servers: list[Server], fake: FakeServer) -> int:
    server = Server([fake])
    await server.start("127.0.0.1", 0)
    servers.append(server)
    return int(server._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


async def switch(
    servers: list[Server], answer: bytes
) -> tuple[apb.SwitchGroupResponse, FakeServer]:
    agent = FakeServer(answer)
    port = await start(servers, agent)
    job = apb.SwitchJob(
        job_id="a", backend_config=apb.BackendConfig(named=apb.NamedBackendConfig(name="noop"))
    )
    async with AsyncSnapshotAgentClient(f"127.0.0.1:{port}") as client:
        reply = await client.switch_group("g", "b", 7, jobs=[job, bytes(job)], timeout_sec=5)
    return reply, agent


async def test_a_well_formed_answer_is_read_whole(serve: list[Server]) -> None:
    answer = apb.SwitchGroupResponse(
        steps=[apb.SwitchStep(job_id="a", kind="snapshot", status=apb.OperationStatus.COMPLETE)],
        restored=True,
        next_state=apb.JobState.RUNNING,
        jobs=[apb.JobStatus(job_id="b", state=apb.JobState.RUNNING, liveness=apb.Liveness.ALIVE)],
        table_version=3,
    )
    reply, agent = await switch(serve, bytes(answer))
    assert reply == answer
    # A job given encoded already is sent as the same job.
    [request] = agent.requests
    assert request.jobs[0] == request.jobs[1]
    assert request.jobs[0].backend_config.named.name == "noop"
    assert (request.group, request.next_job_id, request.fencing_token) == ("g", "b", 7)


@pytest.mark.parametrize("answer", MALFORMED, ids=MALFORMED_IDS)
async def test_a_malformed_switch_answer_is_refused(serve: list[Server], answer: bytes) -> None:
    with pytest.raises(InternalError, match="the answer to SwitchGroup is malformed"):
        await switch(serve, answer)


async def acquire(servers: list[Server], answer: bytes) -> None:
    port = await start(servers, FakeServer(answer, ACQUIRE))
    async with AsyncTimeSliceOrchestratorClient(
        f"127.0.0.1:{port}", "job-a", "g", lease_ttl_sec=None
    ) as client:
        await client.acquire(timeout_sec=5)


async def test_a_well_formed_acquire_answer_is_read(serve: list[Server]) -> None:
    await acquire(serve, bytes(pb.AcquireResponse(success=True, fencing_token=3)))


@pytest.mark.parametrize(
    "answer",
    [
        b"\xa2\x06\x05ab",  # the lease cut short
        b"\x08\x01\x18\x01\x0a\x02ab",  # success as a text
        b"\xa2\x06\x04\x0a\x02\xff\xfe",  # a lease id that is not UTF-8
    ],
    ids=MALFORMED_IDS,
)
async def test_a_malformed_acquire_answer_is_refused(serve: list[Server], answer: bytes) -> None:
    with pytest.raises(InternalError, match="the answer to Acquire is malformed"):
        await acquire(serve, answer)
