"""The orchestrator clients against the real Orchestrator, in process, on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from timeslice.client import (
    AsyncTimeSliceOrchestratorClient,
    GroupLockState,
    TimeSliceOrchestratorClient,
)
from timeslice.errors import DeadlineExceededError, LeaseLostError, TimeSliceError
from timeslice.orchestrator.server import Orchestrator


@pytest.fixture
async def address() -> AsyncIterator[str]:
    async with Orchestrator() as orch:
        yield orch.address


async def test_two_async_clients_alternate_a_hundred_times(address: str) -> None:
    holders: list[str] = []
    tokens: list[int] = []
    inside = 0

    async def take_turns(job: str) -> None:
        nonlocal inside
        async with AsyncTimeSliceOrchestratorClient(address, job, "g") as client:
            for _ in range(100):
                async with client.acquire(timeout_sec=10) as grant:
                    inside += 1
                    assert inside == 1, "two holders at once"
                    holders.append(job)
                    tokens.append(grant.fencing_token)
                    await asyncio.sleep(0)
                    inside -= 1

    await asyncio.wait_for(asyncio.gather(take_turns("a"), take_turns("b")), 30)

    assert holders.count("a") == holders.count("b") == 100
    assert tokens == sorted(set(tokens))  # every grant a new, larger token
    switches = sum(1 for x, y in zip(holders, holders[1:]) if x != y)
    assert switches >= 150  # while both wait, the lock goes to the other job


async def test_the_blocking_client_acquires_and_releases(address: str) -> None:
    def user_code() -> tuple[bool, GroupLockState, bool, GroupLockState]:
        with TimeSliceOrchestratorClient(address, job_id="a", group_id="g") as client:
            acquired = client.acquire(timeout_sec=5)
            locked = client.get_status().group.group_state
            released = client.release()
            after = client.get_status().group.group_state
            return acquired.success, locked, released.success, after

    acquired, locked, released, after = await asyncio.to_thread(user_code)
    assert acquired and released
    assert locked is GroupLockState.LOCKED
    assert after in (GroupLockState.IDLE, GroupLockState.IDLE_YIELDED)


async def test_a_waiter_that_times_out_leaves_the_queue(address: str) -> None:
    async with (
        AsyncTimeSliceOrchestratorClient(address, "a", "g") as holder,
        AsyncTimeSliceOrchestratorClient(address, "b", "g") as waiter,
    ):
        await holder.acquire()
        with pytest.raises(DeadlineExceededError):
            await waiter.acquire(timeout_sec=0.2)
        status = (await holder.get_status()).group
        assert status.waiter_queue_depth == 0 and status.waiting_jobs == ()
        assert status.locking_job == "a"
        await holder.release()


async def test_a_held_lease_outlives_its_ttl_while_renewed(address: str) -> None:
    async with AsyncTimeSliceOrchestratorClient(address, "a", "g", lease_ttl_sec=0.3) as client:
        acquired = await client.acquire()
        assert acquired.lease_ttl_ms == 300
        await asyncio.sleep(0.8)
        assert not client.lease_lost()
        assert (await client.get_status()).group.locking_job == "a"
        assert (await client.release()).success


async def test_a_forced_release_is_noticed_and_the_late_release_refused(address: str) -> None:
    lost: list[TimeSliceError] = []
    async with (
        AsyncTimeSliceOrchestratorClient(
            address, "a", "g", lease_ttl_sec=0.3, on_lease_lost=lambda g, j, e: lost.append(e)
        ) as holder,
        AsyncTimeSliceOrchestratorClient(address, group_id="g") as operator,
    ):
        await holder.acquire()
        released = await operator.force_release(job_id="a", reason="test")
        assert released.released_job_id == "a"
        async with asyncio.timeout(2):
            while not lost:
                await asyncio.sleep(0.01)
        assert holder.lease_lost()
        assert isinstance(lost[0], LeaseLostError)
        with pytest.raises(LeaseLostError):
            await holder.release()
