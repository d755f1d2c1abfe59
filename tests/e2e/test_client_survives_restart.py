"""Jobs whose orchestrator is killed and restarted under them go on as if nothing
happened: no public client call raises `asyncio.CancelledError` unless its own
task was cancelled.

grpclib cancels the task that awaits a call when the call's connection closes
(and when its deadline passes) and never takes that cancellation back, so a
client that took `cancelling()` at its word used to end a job with
CancelledError at its next release, the lock still held.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from orchestrator_process import Server

from tests.ports import free_port
from timeslice import AsyncTimeSliceOrchestratorClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

GROUP = "g"


async def test_jobs_release_normally_after_their_orchestrator_was_killed_and_restarted(
    serve: Callable[..., Awaitable[Server]], tmp_path: Path
) -> None:
    port = free_port()
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    server = await serve(port, journal, "--recovery-grace", "20")
    address = f"127.0.0.1:{port}"
    holder = AsyncTimeSliceOrchestratorClient(address, "holder", GROUP, lease_ttl_sec=30)
    waiter = AsyncTimeSliceOrchestratorClient(address, "waiter", GROUP, lease_ttl_sec=30)
    async with holder, waiter:
        await holder.acquire()

        async def wait_then_release() -> bool:
            granted = await waiter.acquire()
            assert granted.success
            # The task that awaited the dropped Acquire is not taken for cancelled.
            current = asyncio.current_task()
            assert current is not None and not current.cancelling()
            return (await waiter.release()).success

        waiting = asyncio.create_task(wait_then_release())
        while (await holder.get_status()).group.waiter_queue_depth < 1:
            await asyncio.sleep(0.02)
        # The waiter's Acquire is in flight, the holder's KeepAlive may be: both
        # connections drop under them.
        assert server.stop(signal.SIGKILL, 10) == -signal.SIGKILL
        await asyncio.sleep(0.3)
        await serve(port, journal, "--recovery-grace", "20")

        released = await holder.release()
        assert released.success
        assert await asyncio.wait_for(waiting, 30)
        async with waiter.acquire(timeout_sec=10):
            pass
        status = await holder.get_status()
        assert status.group.locking_job == ""


async def test_a_job_blocked_in_acquire_on_a_killed_orchestrator_is_granted_by_the_next(
    serve: Callable[..., Awaitable[Server]], tmp_path: Path
) -> None:
    """The whole `async with client.acquire()` of a job, with the orchestrator
    killed while the job waits: the block runs and its release goes through."""
    port = free_port()
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    server = await serve(port, journal, "--recovery-grace", "20")
    address = f"127.0.0.1:{port}"
    holder = AsyncTimeSliceOrchestratorClient(address, "holder", GROUP)
    job = AsyncTimeSliceOrchestratorClient(address, "job", GROUP)
    ran = asyncio.Event()

    async def work() -> None:
        async with job.acquire():
            ran.set()

    async with holder, job:
        await holder.acquire()
        task = asyncio.create_task(work())
        while (await holder.get_status()).group.waiter_queue_depth < 1:
            await asyncio.sleep(0.02)
        server.stop(signal.SIGKILL, 10)
        await serve(port, journal, "--recovery-grace", "20")
        await holder.release()
        await asyncio.wait_for(task, 30)  # raised CancelledError at the release
        assert ran.is_set()
        assert (await holder.get_status()).group.locking_job == ""
