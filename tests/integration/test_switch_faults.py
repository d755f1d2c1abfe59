"""A switch that fails: the failing job is quarantined (the group goes on with the
others), the quarantine shows in GetGroupStatus and holds until an operator
resets the job; an agent that cannot be reached fails the switch at its
deadline. In-process Orchestrator and Agent over real gRPC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterable

import pytest

from tests.waiting import until
from timeslice import Agent, AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.client.workload import WorkloadRegistration, register_workload
from timeslice.errors import ConflictError


class Flaky:
    """A workload whose snapshot or restore fails while told to."""

    def __init__(self, state: str = "RUNNING") -> None:
        self.state = state
        self.fail_snapshot = self.fail_restore = False

    def snapshot(self, mode: str, tags: Iterable[str]) -> None:
        if self.fail_snapshot:
            raise RuntimeError("device busy")
        self.state = "SAVED"

    def restore(self, tags: Iterable[str]) -> None:
        if self.fail_restore:
            raise RuntimeError("out of memory")
        self.state = "RUNNING"


async def _register(agent: Agent, workloads: dict[str, Flaky]) -> list[WorkloadRegistration]:
    return [await register_workload(agent.address, job, "g", w) for job, w in workloads.items()]


async def test_a_failed_snapshot_quarantines_that_job_and_the_next_one_runs() -> None:
    workloads = {"a": Flaky(), "b": Flaky()}
    async with Orchestrator(group_nodes={"g": ("n1",)}) as orch:
        async with Agent(
            node_name="n1", backends=("app_channel",), orchestrator=orch.address
        ) as agent:
            registrations = await _register(agent, workloads)
            async with AsyncTimeSliceOrchestratorClient(orch.address, group_id="g") as c:
                await c.acquire("a")
                assert workloads["b"].state == "SAVED"
                waiting = asyncio.ensure_future(c.acquire("b"))
                await until(lambda: "b" in orch.table.groups["g"].queue, "b waits")
                workloads["a"].fail_snapshot = True
                await c.release("a")
                granted = await asyncio.wait_for(waiting, 10)
                assert granted.context_restored and workloads["b"].state == "RUNNING"

                status = await c.get_status()
                assert list(status.group.quarantined_jobs) == ["a"]
                assert "device busy" in status.group.quarantined_jobs["a"]
                states = {s.job_id: s.job_state.value for s in status.agent_job_states}
                assert states == {"a": "FAULTED", "b": "RUNNING"}
                with pytest.raises(ConflictError, match="quarantined"):
                    await c.acquire("a")

                workloads["a"].fail_snapshot = False
                assert await c.reset_job("a")
                assert not await c.reset_job("a")  # nothing left to lift
                status = await c.get_status()
                assert status.group.quarantined_jobs == {}
                assert {s.job_id: s.job_state.value for s in status.agent_job_states}["a"] in (
                    "RUNNING",
                    "IDLE",
                )
                waiting = asyncio.ensure_future(c.acquire("a"))
                await until(lambda: "a" in orch.table.groups["g"].queue, "a waits")
                await c.release("b")
                await asyncio.wait_for(waiting, 10)  # a may hold the group again
                await c.release("a")
            for registration in registrations:
                await registration.close()
            orch.table.validate()


async def test_a_failed_restore_quarantines_the_next_holder_and_the_one_after_runs() -> None:
    workloads = {"a": Flaky(), "b": Flaky(), "c": Flaky()}
    async with Orchestrator(group_nodes={"g": ("n1",)}) as orch:
        async with Agent(
            node_name="n1", backends=("app_channel",), orchestrator=orch.address
        ) as agent:
            registrations = await _register(agent, workloads)
            async with AsyncTimeSliceOrchestratorClient(orch.address, group_id="g") as c:
                await c.acquire("a")
                b_waits = asyncio.ensure_future(c.acquire("b"))
                await until(lambda: "b" in orch.table.groups["g"].queue, "b waits")
                c_waits = asyncio.ensure_future(c.acquire("c"))
                await until(lambda: "c" in orch.table.groups["g"].queue, "c waits")
                workloads["b"].fail_restore = True
                await c.release("a")
                with pytest.raises(ConflictError, match="out of memory"):
                    await asyncio.wait_for(b_waits, 10)
                granted = await asyncio.wait_for(c_waits, 10)
                assert granted.context_restored
                status = (await c.get_status()).group
                assert status.locking_job == "c" and list(status.quarantined_jobs) == ["b"]
                await c.release("c")
            for registration in registrations:
                await registration.close()
            orch.table.validate()


async def test_an_unreachable_agent_fails_the_switch_at_its_deadline(free_port: int) -> None:
    nodes = {"g": ("n1", f"127.0.0.1:{free_port}")}  # nobody listens on the second
    async with Orchestrator(group_nodes=nodes, switch_timeout=1.0) as orch:
        async with Agent(node_name="n1", backends=("noop",), orchestrator=orch.address):
            async with AsyncTimeSliceOrchestratorClient(orch.address, group_id="g") as c:
                began = asyncio.get_running_loop().time()
                with pytest.raises(ConflictError, match="switch failed"):
                    await c.acquire("a")
                took = asyncio.get_running_loop().time() - began
                assert 0.9 < took < 5
                status = (await c.get_status()).group
                assert status.locking_job == "" and status.loaded_job == ""
                assert status.quarantined_jobs == {}  # nobody's fault but the node's
                assert status.group_state.value == "UNKNOWN"


async def test_a_group_with_nodes_is_known_before_anyone_asks_for_it() -> None:
    async with Orchestrator(group_nodes={"g": ("n1",)}) as orch:
        async with AsyncTimeSliceOrchestratorClient(orch.address, group_id="g") as c:
            assert await c.list_groups() == ["g"]
            status = await c.get_status()  # n1 has no agent yet: its state is unknown
            assert (status.group.group_state.value, status.group.nodes) == ("UNKNOWN", ("n1",))
            assert status.group.locking_job == "" and status.group.state_timestamp is None


SHUTDOWN_WITH_WAITERS = """
import asyncio, gc, sys
from timeslice import AsyncTimeSliceOrchestratorClient, Orchestrator

async def main():
    orch = Orchestrator(db=sys.argv[1])
    await orch.start()
    client = AsyncTimeSliceOrchestratorClient(orch.address, group_id="g", reconnect_timeout_sec=0)
    await client.acquire(job_id="holder")
    waiting = [asyncio.ensure_future(client.acquire(job_id=f"job-{i}")) for i in range(300)]
    await asyncio.sleep(0.02)  # some are queued, some still being journaled
    closing = asyncio.ensure_future(orch.close())
    await asyncio.sleep(0)
    for call in waiting:
        call.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    await closing
    await client.close()

asyncio.run(main())
gc.collect()  # an error nobody read is reported when its future is collected
"""


def test_acquires_cut_short_by_a_shutdown_leave_no_unread_errors(sqlite_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_WITH_WAITERS, sqlite_url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "never retrieved" not in done.stderr, done.stderr
