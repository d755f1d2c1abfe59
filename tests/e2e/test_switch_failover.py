"""The active orchestrator killed with SIGKILL at each step of a switch, a standby
on the same PostgreSQL journal taking over: the new active finishes the switch,
never with two live contexts on the node, keeps the holder and every waiter's
place, and the clients, given both addresses, follow it with their request ids
(TIMESLICE_TEST_POSTGRES_URL; see test_switch_restart for a restart instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpclib.exceptions import GRPCError
from orchestrator_process import Server, connect, free_port
from recorded_workloads import NodeRecord, RecordedWorkload

from tests.optional import need_postgres
from tests.postgres import scratch_database
from timeslice import Agent, AsyncTimeSliceOrchestratorClient
from timeslice._failpoints import SWITCH_JOURNALED, SWITCH_MOVED
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client.workload import register_workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

GROUP = "g"
LEASE = 1.0


@pytest.fixture
async def journal() -> AsyncIterator[str]:
    async with scratch_database(need_postgres(), f"timeslice_switch_failover_{os.getpid()}") as url:
        yield url


async def _role(port: int) -> str:
    async with connect(port) as stub:
        with contextlib.suppress(OSError, GRPCError, TimeoutError):
            return (await stub.get_leadership(pb.GetLeadershipRequest(), timeout=1)).role
    return ""


async def _until_role(port: int, role: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await _role(port) != role:
        assert time.monotonic() < deadline, f"127.0.0.1:{port} never became {role}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("step", ["journaled", "restoring", "moved"])
async def test_a_standby_finishes_the_switch_the_killed_active_began(
    step: str, journal: str, tmp_path: Path
) -> None:
    ports = [free_port(), free_port()]
    options = ("--group-nodes", f"{GROUP}=n1", "--recovery-grace", "20",
               "--leader-lease", str(LEASE))  # fmt: skip
    # The first switch (to A) goes through; the second (A -> B) is where it dies.
    failpoint = {"journaled": SWITCH_JOURNALED, "moved": SWITCH_MOVED}.get(step)
    env = {"TIMESLICE_FAILPOINTS": f"{failpoint}@2"} if failpoint else None
    active = Server(ports[0], journal, tmp_path / "active.log", *options, env=env)
    standby: Server | None = None
    try:
        await active.ready()
        standby = Server(ports[1], journal, tmp_path / "standby.log", *options)
        await _until_role(ports[1], "standby", 30)
        targets = ",".join(f"127.0.0.1:{port}" for port in ports)
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
                await register_workload(agent.address, job, GROUP, workloads[job])
                for job in workloads
            ]
            clients = {
                job: AsyncTimeSliceOrchestratorClient(
                    targets, job_id=job, group_id=GROUP, lease_ttl_sec=30
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
                    active.process.kill()
                assert await asyncio.to_thread(active.process.wait, 10) == -signal.SIGKILL
                assert not b_granted.done()

                await _until_role(ports[1], "active", LEASE + 10)
                gate.set()
                second = await asyncio.wait_for(b_granted, 30)
                await asyncio.wait_for(a_released, 10)
                assert second.context_restored
                assert second.fencing_token > first.fencing_token
                assert record.live == {"B"}
                workloads["B"].check_and_write(2.0)  # B's bytes as it left them

                await clients["B"].release()
                third = await asyncio.wait_for(c_granted, 30)  # the waiter behind was kept
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
    finally:
        for server in (active, standby):
            if server is not None and server.process.poll() is None:
                server.process.kill()
                server.process.wait(10)
    assert record.violations == []
    assert record.most_live == 1


async def _queued(client: AsyncTimeSliceOrchestratorClient, jobs: tuple[str, ...]) -> None:
    for _ in range(500):
        if (await client.get_status()).group.waiting_jobs == jobs:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{jobs} never queued")
