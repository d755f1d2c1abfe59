"""The orchestrator killed with SIGKILL at a step of a switch, and what must hold
after it comes back (restarted on its journal, or replaced by a standby): the
switch completes, never with two live contexts on the node, and no waiter is lost.

The steps: right after the grant that starts the switch is journaled (before any
agent is asked; failpoint `switch-journaled`); after the snapshot, while the
restore runs (the workload holds its restore until the orchestrator is back);
after the restore, before the switch's end is journaled (`switch-moved`). The
agent and the jobs' workloads live in the test process, the orchestrator in its
own.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from recorded_workloads import NodeRecord, RecordedWorkload

from timeslice import Agent, AsyncTimeSliceOrchestratorClient
from timeslice._failpoints import SWITCH_JOURNALED, SWITCH_MOVED
from timeslice.client.workload import register_workload

GROUP = "g"
STEPS = ("journaled", "restoring", "moved")


def failpoint_env(step: str) -> dict[str, str] | None:
    """The environment that kills the orchestrator at `step` of its second switch (the
    first, to A, goes through; the second, A -> B, is where it dies); None for
    "restoring", where the test kills it itself."""
    failpoint = {"journaled": SWITCH_JOURNALED, "moved": SWITCH_MOVED}.get(step)
    return {"TIMESLICE_FAILPOINTS": f"{failpoint}@2"} if failpoint else None


async def killed_mid_switch(
    step: str,
    tmp_path: Path,
    targets: str,
    orchestrator: subprocess.Popen[bytes],
    back: Callable[[], Awaitable[None]],
    lease_ttl_sec: float = 10.0,
) -> None:
    """A holds group g on node n1, B and C wait; A yields and `orchestrator` dies at
    `step` of the switch to B; once `back()` has brought an orchestrator back, B is
    granted with its context, then C, then A again, each with the bytes it left."""
    record = NodeRecord("n1")
    gate = threading.Event()
    workloads = {
        job: RecordedWorkload(
            job, record, tmp_path / job, gate if job == "B" and step == "restoring" else None
        )
        for job in ("A", "B", "C")
    }
    async with Agent(node_name="n1", backends=("app_channel",), orchestrator=targets) as agent:
        registrations = [
            await register_workload(agent.address, job, GROUP, workloads[job]) for job in workloads
        ]
        clients = {
            job: AsyncTimeSliceOrchestratorClient(
                targets, job_id=job, group_id=GROUP, lease_ttl_sec=lease_ttl_sec
            )
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
                orchestrator.kill()
            assert await asyncio.to_thread(orchestrator.wait, 10) == -signal.SIGKILL
            assert not b_granted.done()

            await back()
            gate.set()
            second = await asyncio.wait_for(b_granted, 30)
            await asyncio.wait_for(a_released, 10)
            assert second.context_restored
            assert second.fencing_token > first.fencing_token
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
