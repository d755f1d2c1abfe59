"""A holder whose process is frozen (SIGSTOP) past its lease is revoked, and the next
job runs after the revoked holder's short snapshot limit, not the switch timeout:
the frozen job is quarantined. When the process is let go again (SIGCONT) its
workload carries the old snapshot command out and answers late; the agent then
knows its context is saved, and after a reset the job gets the group back with
every byte of its context restored.

The holder is `tests/workloads/hostmem_worker.py` in its own process; the next
job's workload lives in the test process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.waiting import until
from tests.workloads.worker_process import hostmem_worker
from timeslice import Agent, AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.agent.state import JobState
from timeslice.client.workload import register_workload
from timeslice.workloads import HostMemoryWorkload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

LEASE = 1.0
REVOKED_LIMIT = 1.0


async def test_a_holder_frozen_past_its_lease_does_not_stall_the_group(tmp_path: Path) -> None:
    async with Orchestrator(
        group_nodes={"g": ("n1",)}, switch_timeout=60.0, revoked_snapshot_timeout=REVOKED_LIMIT
    ) as orch:
        agent = Agent(node_name="n1", backends=("app_channel",), orchestrator=orch.address)
        async with agent, hostmem_worker(agent.address, "frozen", "g", 4, 7, tmp_path) as worker:
            memory = HostMemoryWorkload(tmp_path / "next")
            memory.allocate("weights", 1024, np.float64)[:] = 5.0
            registration = await register_workload(agent.address, "next", "g", memory)
            assert (await worker.ask(f"acquire {orch.address} {LEASE}"))["granted"]
            pid = worker.process.pid
            try:
                async with AsyncTimeSliceOrchestratorClient(
                    orch.address, job_id="next", group_id="g"
                ) as client:
                    waiting = asyncio.ensure_future(client.acquire())
                    await until(lambda: "next" in orch.table.groups["g"].queue, "next waits")
                    assert not waiting.done()
                    os.kill(pid, signal.SIGSTOP)
                    stopped_at = time.monotonic()
                    result = await asyncio.wait_for(waiting, 20)
                    took = time.monotonic() - stopped_at
                    assert result.context_restored and float(memory["weights"][0]) == 5.0
                    assert took < LEASE + REVOKED_LIMIT + 3.0, took  # not the 60 s switch
                    status = await client.get_status()
                    assert list(status.group.quarantined_jobs) == ["frozen"]

                    os.kill(pid, signal.SIGCONT)
                    # The late answer: the context is saved, as the workload says too.
                    channel = agent.channels.get("g", "frozen")
                    assert channel is not None
                    await until(lambda: channel.state == "SAVED", "the late answer", timeout=10)
                    assert (await worker.ask("state"))["state"] == "SAVED"
                    assert agent.table.job("g", "frozen").state is JobState.FAULTED
                    assert await client.reset_job("frozen")
                    assert agent.table.job("g", "frozen").state is JobState.SAVED

                    back = asyncio.ensure_future(worker.ask(f"acquire {orch.address} none"))
                    await until(
                        lambda: "frozen" in orch.table.groups["g"].queue, "frozen waits", timeout=10
                    )
                    await client.release()
                    granted = await asyncio.wait_for(back, 20)
                    assert granted["granted"] and granted["context_restored"]
                    assert await worker.verify() == {"ok": True, "mismatched": []}
                    assert memory.state == "SAVED"
            finally:
                if worker.process.returncode is None:
                    os.kill(pid, signal.SIGCONT)  # never leave it stopped
                await registration.close()
