"""`timeslice serve orchestrator` killed with SIGKILL at each step of a switch, then
restarted on its journal: the switch completes, never with two live contexts on
the node, and no waiter is lost.

The steps: right after the grant that starts the switch is journaled (before any
agent is asked); after the snapshot, while the restore runs (the workload holds
its restore until the new orchestrator is up); after the restore, before the
switch's end is journaled. The agent and the jobs' workloads live in the test
process, the orchestrator in its own.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from orchestrator_process import Server, free_port
from recorded_workloads import NodeRecord, RecordedWorkload

from timeslice import Agent, AsyncTimeSliceOrchestratorClient
from timeslice._failpoints import SWITCH_JOURNALED, SWITCH_MOVED
from timeslice.client.workload import register_workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

GROUP = "g"


@pytest.mark.parametrize("step", ["journaled", "restoring", "moved"])
async def test_a_switch_survives_sigkill_of_the_orchestrator_at_each_step(
    step: str, serve: Callable[..., Awaitable[Server]], tmp_path: Path
) -> None:
    port = free_port()
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    options = ("--group-nodes", f"{GROUP}=n1", "--recovery-grace", "20")
    # The first switch (to A) goes through; the second (A -> B) is where it dies.
    failpoint = {"journaled": SWITCH_JOURNALED, "moved": SWITCH_MOVED}.get(step)
    env = {"TIMESLICE_FAILPOINTS": f"{failpoint}@2"} if failpoint else None
    server = await serve(port, journal, *options, env=env)
    record = NodeRecord("n1")
    gate = threading.Event()
    workloads = {
        job: RecordedWorkload(
            job, record, tmp_path / job, gate if job == "B" and step == "restoring" else None
        )
        for job in ("A", "B", "C")
    }
    address = f"127.0.0.1:{port}"
    async with Agent(node_name="n1", backends=("app_channel",), orchestrator=address) as agent:
        registrations = [
            await register_workload(agent.address, job, GROUP, workloads[job]) for job in workloads
        ]
        clients = {
            job: AsyncTimeSliceOrchestratorClient(address, job_id=job, group_id=GROUP)
            for job in workloads
        }
        try:
            first = await clients["A"].acquire()
            assert first.context_restored and record.live == {"A"}
            workloads["A"].check_and_write(1.0)
            b_granted = asyncio.ensure_future(clients["B"].acquire())
            await _queued(clients["A"], ("B",))
            c_granted = asyncio.ensure_future(clients["C"].acquire())
            await _queued(clients["A"], ("B", "C"))
            a_released = asyncio.ensure_future(clients["A"].release())

            if step == "restoring":
                await asyncio.to_thread(workloads["B"].restoring.wait, 10)
                assert record.live == set()  # A is saved; B not back yet
                server.process.kill()
            assert await asyncio.to_thread(server.process.wait, 10) == -signal.SIGKILL
            assert not b_granted.done()

            server = await serve(port, journal, *options)
            gate.set()
            second = await asyncio.wait_for(b_granted, 30)
            await asyncio.wait_for(a_released, 10)
            assert second.context_restored
            assert record.live == {"B"}
            workloads["B"].check_and_write(2.0)  # B's bytes as it left them

            await clients["B"].release()
            third = await asyncio.wait_for(c_granted, 30)  # the waiter behind was not lost
            assert third.context_restored and record.live == {"C"}
            workloads["C"].check_and_write(3.0)
            await clients["C"].release()
            again = await clients["A"].acquire()
            assert again.context_restored
            workloads["A"].check_and_write(4.0)  # A's bytes survived both switches
            await clients["A"].release()
        finally:
            gate.set()
            for client in clients.values():
                await client.close()
            for registration in registrations:
                await registration.close()
    assert record.violations == []
    assert record.most_live == 1


async def _queued(client: AsyncTimeSliceOrchestratorClient, jobs: tuple[str, ...]) -> None:
    for _ in range(500):
        if (await client.get_status()).group.waiting_jobs == jobs:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{jobs} never queued")
