"""The agent clients against the real Agent, in process, on 127.0.0.1, with the noop backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from grpclib.client import Channel
from grpclib.const import Status

from timeslice.agent.server import Agent
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client.agent import AsyncSnapshotAgentClient, SnapshotAgentClient
from timeslice.client.agent_types import JobStatus, app_channel_config, named_backend
from timeslice.errors import (
    ConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
)

NOOP = named_backend("noop")


@pytest.fixture
async def address() -> AsyncIterator[str]:
    async with Agent(node_name="n1") as agent:
        yield agent.address


@pytest.fixture
async def client(address: str) -> AsyncIterator[AsyncSnapshotAgentClient]:
    async with AsyncSnapshotAgentClient(address) as client:
        yield client


def job_states(statuses: list[JobStatus]) -> dict[str, str]:
    return {status.job_id: status.state for status in statuses}


async def test_a_noop_job_is_snapshotted_and_restored(client: AsyncSnapshotAgentClient) -> None:
    saved = await client.snapshot_and_wait("job-1", "g", backend_config=NOOP, timeout_sec=5)
    assert saved.status == "OPERATION_STATUS_COMPLETE"
    assert (saved.job_id, saved.group, saved.kind, saved.backend) == (
        "job-1",
        "g",
        "snapshot",
        "noop",
    )
    after_snapshot = await client.status()
    assert after_snapshot.node_name == "n1"
    [job] = after_snapshot.job_statuses
    assert (job.job_id, job.state, job.group, job.backend) == (
        "job-1",
        "JOB_STATE_SAVED",
        "g",
        "noop",
    )

    restored = await client.restore_and_wait("job-1", "g", timeout_sec=5)
    assert (restored.status, restored.kind) == ("OPERATION_STATUS_COMPLETE", "restore")
    after_restore = await client.status()
    assert job_states(after_restore.job_statuses) == {"job-1": "JOB_STATE_RUNNING"}
    assert after_restore.job_statuses[0].operation_id != job.operation_id


async def test_the_agent_is_healthy(client: AsyncSnapshotAgentClient) -> None:
    assert (await client.check_health()).status == "SERVING"
    service = "snapshot_agent.v1alpha1.SnapshotAgentService"
    assert (await client.check_health(service)).status == "SERVING"


async def test_a_restore_of_a_job_not_saved_is_refused(client: AsyncSnapshotAgentClient) -> None:
    await client.snapshot_and_wait("job-1", "g", backend_config=NOOP)
    await client.restore_and_wait("job-1", "g")
    with pytest.raises(ConflictError, match="RUNNING") as raised:
        await client.restore("job-1", "g")
    assert raised.value.status == Status.FAILED_PRECONDITION
    assert type(raised.value) is ConflictError  # not the orchestrator's NotHolderError
    with pytest.raises(ConflictError):
        await client.restore_and_wait("job-1", "g")
    with pytest.raises(NotFoundError, match="unknown job"):
        await client.restore("job-2", "g", backend_config=NOOP)


async def test_refusals_raise_their_errors(client: AsyncSnapshotAgentClient) -> None:
    await client.snapshot_and_wait("job-1", "g", backend_config=NOOP, fencing_token=5)
    with pytest.raises(LeaseLostError, match="stale fencing token"):
        await client.restore("job-1", "g", fencing_token=3)
    with pytest.raises(ConflictError, match="not FAULTED"):
        await client.reset_job("job-1", "g")
    with pytest.raises(InvalidArgumentError, match="unknown backend"):
        await client.snapshot("job-2", "g", backend_config=named_backend("no-such-backend"))
    with pytest.raises(NotFoundError):
        await client.get_operation("no-such-operation")


async def test_the_blocking_client_keeps_the_v1alpha1_calls(address: str) -> None:
    def user_code() -> tuple[str, str, str, str]:
        with SnapshotAgentClient(address) as client:
            saved = client.snapshot_and_wait("job-1", "g", 0.01, NOOP)
            state_saved = client.status().job_statuses[0].state
            restored = client.restore_and_wait("job-1", "g", 0.01)
            state_running = client.status().job_statuses[0].state
            assert client.check_health().status == "SERVING"
            return saved.status, state_saved, restored.status, state_running

    assert await asyncio.to_thread(user_code) == (
        "OPERATION_STATUS_COMPLETE",
        "JOB_STATE_SAVED",
        "OPERATION_STATUS_COMPLETE",
        "JOB_STATE_RUNNING",
    )


async def test_a_wait_is_answered_when_the_operation_ends_not_at_the_next_poll(
    address: str, client: AsyncSnapshotAgentClient
) -> None:
    outbox: asyncio.Queue[pb.WorkloadMessage | None] = asyncio.Queue()
    outbox.put_nowait(pb.WorkloadMessage(register=pb.RegisterWorkload(job_id="w", group="g")))

    async def messages() -> AsyncIterator[pb.WorkloadMessage]:
        while (message := await outbox.get()) is not None:
            yield message

    async def workload(channel: Channel) -> None:
        async for command in pb.SnapshotAgentServiceStub(channel).workload_channel(messages()):
            await asyncio.sleep(0.3)  # moving the context takes a while
            result = pb.CommandResult(command_id=command.command_id, ok=True)
            outbox.put_nowait(pb.WorkloadMessage(result=result))

    host, port = address.rsplit(":", 1)
    channel = Channel(host, int(port))
    running = asyncio.create_task(workload(channel))
    try:
        while job_states((await client.status()).job_statuses).get("w") != "JOB_STATE_RUNNING":
            await asyncio.sleep(0.01)
        started = time.monotonic()
        operation = await client.snapshot("w", "g", backend_config=app_channel_config())
        done = await client.wait_for_operation(operation.operation_id, poll_interval_sec=5)
        assert done.status == "OPERATION_STATUS_COMPLETE"
        assert 0.3 <= time.monotonic() - started < 2
    finally:
        outbox.put_nowait(None)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        channel.close()
