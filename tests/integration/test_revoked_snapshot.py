"""A frozen holder does not stall its group: the snapshot of a holder that lost the
group without yielding has its own short limit (`revoked_snapshot_timeout`); when
it runs out the job is quarantined and the next one is switched in, while a
yielding holder's snapshot keeps the whole switch timeout. The frozen workload's
answer, when it wakes, comes too late to change the switch, and only tells the
agent where its context went. In-process Orchestrator and Agent over real gRPC on
127.0.0.1; the frozen workload blocks in its snapshot until the test thaws it.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.waiting import until
from timeslice import Agent, AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.agent.state import JobState
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client import AsyncSnapshotAgentClient, app_channel_config
from timeslice.client.workload import register_workload
from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator import events as ev

pytestmark = pytest.mark.timeout(30)

SWITCH_TIMEOUT = 60.0  # what the next job would wait without the revoked limit
REVOKED_LIMIT = 0.5
LEASE = 0.3


class Freezable:
    """A workload whose snapshot blocks while it is frozen, as a stopped process's
    would: it carries the command out only when thawed (on the registration's
    worker thread, so the test's event loop runs on)."""

    def __init__(self) -> None:
        self.state = "RUNNING"
        self.frozen = False
        self.snapshots = 0
        self._thawed = threading.Event()

    def snapshot(self, mode: str, tags: Iterable[str]) -> None:
        self.snapshots += 1
        if self.frozen:
            self._thawed.wait(30)
        self.state = "SAVED"

    def restore(self, tags: Iterable[str]) -> None:
        self.state = "RUNNING"

    def thaw(self) -> None:
        self._thawed.set()


@asynccontextmanager
async def group_of(
    workloads: dict[str, Freezable], hold_limit: float | None = None
) -> AsyncIterator[tuple[Orchestrator, Agent]]:
    """An orchestrator whose group "g" spans one agent's node, with a long switch
    timeout and a short revoked-snapshot limit, and `workloads` registered there
    (thawed and deregistered at the end)."""
    async with Orchestrator(
        group_nodes={"g": ("n1",)},
        switch_timeout=SWITCH_TIMEOUT,
        revoked_snapshot_timeout=REVOKED_LIMIT,
        hold_limit=hold_limit,
    ) as orch:
        agent = Agent(node_name="n1", backends=("app_channel",), orchestrator=orch.address)
        async with agent:
            registrations = [
                await register_workload(agent.address, job, "g", w, connect_timeout_sec=5)
                for job, w in workloads.items()
            ]
            try:
                yield orch, agent
            finally:
                for workload in workloads.values():
                    workload.thaw()
                for registration in registrations:
                    await registration.close()
            orch.table.validate()
            agent.table.validate()


def agent_state(agent: Agent, job: str) -> JobState:
    return agent.table.job("g", job).state


async def notices_until_granted(watch: AsyncIterable[Any], job: str) -> list[ev.Effect]:
    """The effects a watch of the group reports, up to `job`'s grant."""
    seen: list[ev.Effect] = []
    async for notice in watch:
        seen.append(notice.effect)
        if isinstance(notice.effect, ev.Granted) and notice.effect.job == job:
            break
    return seen


async def test_a_frozen_holder_revoked_by_its_lease_is_quarantined_and_the_next_job_runs() -> None:
    workloads = {"frozen": Freezable(), "next": Freezable()}
    async with group_of(workloads) as (orch, agent):
        holder = AsyncTimeSliceOrchestratorClient(orch.address, "frozen", "g", lease_ttl_sec=LEASE)
        await holder.acquire()
        assert workloads["next"].state == "SAVED"  # moved out for the holder
        watch = orch.watch("g")
        async with AsyncTimeSliceOrchestratorClient(orch.address, "next", "g") as client:
            waiting = asyncio.ensure_future(client.acquire())
            await until(lambda: "next" in orch.table.groups["g"].queue, "next waits")
            workloads["frozen"].frozen = True
            silent_at = time.monotonic()
            await holder.close()  # no more keepalives: the lease runs out
            granted = await asyncio.wait_for(waiting, 10)
            took = time.monotonic() - silent_at
            assert granted.context_restored and workloads["next"].state == "RUNNING"
            # What is left of its lease, then the revoked holder's limit, and a little
            # for the moves; not the switch timeout.
            assert REVOKED_LIMIT - 0.05 < took < LEASE + REVOKED_LIMIT + 1.5, took
            effects = await asyncio.wait_for(notices_until_granted(watch, "next"), 5)
            watch.close()
            revoked = [e.reason for e in effects if isinstance(e, ev.Revoked)]
            assert revoked == [ev.Reason.LEASE_EXPIRED]

            # The frozen job is quarantined as after any failed snapshot.
            status = await client.get_status()
            assert list(status.group.quarantined_jobs) == ["frozen"]
            reason = status.group.quarantined_jobs["frozen"]
            assert "snapshot failed on n1" in reason and "revoked holder" in reason, reason
            states = {s.job_id: s.job_state.value for s in status.agent_job_states}
            assert states == {"frozen": "FAULTED", "next": "RUNNING"}
            assert workloads["frozen"].snapshots == 1 and workloads["frozen"].state == "RUNNING"

            # Still frozen: a reset lifts the quarantine here, but the agent cannot
            # tell where the context is, so the job stays FAULTED there.
            assert await client.reset_job("frozen")
            assert agent_state(agent, "frozen") is JobState.FAULTED

            # It wakes and answers late: nothing moves, the agent only learns that
            # the context is saved, which a reset then finds.
            workloads["frozen"].thaw()
            channel = agent.channels.get("g", "frozen")
            assert channel is not None
            await until(lambda: channel.state == "SAVED", "the late answer is heard")
            assert agent_state(agent, "frozen") is JobState.FAULTED
            assert workloads["frozen"].state == "SAVED"
            await client.reset_job("frozen")
            assert agent_state(agent, "frozen") is JobState.SAVED

            # And it can hold the group again: its context comes back by a restore.
            async with AsyncTimeSliceOrchestratorClient(orch.address, "frozen", "g") as again:
                back = asyncio.ensure_future(again.acquire())
                await until(lambda: "frozen" in orch.table.groups["g"].queue, "frozen waits")
                await client.release()
                result = await asyncio.wait_for(back, 10)
                assert result.context_restored and workloads["frozen"].state == "RUNNING"
                assert workloads["next"].state == "SAVED"
                await again.release()


async def test_a_yielding_holder_whose_snapshot_is_slow_gets_the_whole_switch_timeout() -> None:
    workloads = {"slow": Freezable(), "next": Freezable()}
    async with group_of(workloads) as (orch, _):
        async with (
            AsyncTimeSliceOrchestratorClient(orch.address, "slow", "g") as holder,
            AsyncTimeSliceOrchestratorClient(orch.address, "next", "g") as client,
        ):
            await holder.acquire()
            waiting = asyncio.ensure_future(client.acquire())
            await until(lambda: "next" in orch.table.groups["g"].queue, "next waits")
            workloads["slow"].frozen = True
            slow = 4 * REVOKED_LIMIT
            threading.Timer(slow, workloads["slow"].thaw).start()
            yielded_at = time.monotonic()
            await holder.release()
            granted = await asyncio.wait_for(waiting, 10)
            took = time.monotonic() - yielded_at
            assert slow - 0.1 < took < slow + 1.5, took
            assert granted.context_restored and workloads["slow"].state == "SAVED"
            status = await client.get_status()
            assert status.group.quarantined_jobs == {}
            await client.release()


async def test_a_hold_limit_revokes_a_frozen_holder_and_the_limit_applies_too() -> None:
    workloads = {"frozen": Freezable(), "next": Freezable()}
    async with group_of(workloads, hold_limit=0.5) as (orch, _):
        async with (
            AsyncTimeSliceOrchestratorClient(orch.address, "frozen", "g") as holder,
            AsyncTimeSliceOrchestratorClient(orch.address, "next", "g") as client,
        ):
            await holder.acquire()  # no lease: only the hold limit ends it
            workloads["frozen"].frozen = True
            began = time.monotonic()
            granted = await asyncio.wait_for(client.acquire(), 10)
            took = time.monotonic() - began
            assert granted.context_restored and took < 0.5 + REVOKED_LIMIT + 1.5, took
            status = await client.get_status()
            assert list(status.group.quarantined_jobs) == ["frozen"]
            await client.release()


# --- the agent's side: SwitchJob.snapshot_timeout_ms ---------------------------------


async def test_an_agent_bounds_a_jobs_snapshot_by_its_own_limit_and_restores_the_next() -> None:
    workloads = {"frozen": Freezable(), "next": Freezable()}
    async with Agent(node_name="n1", backends=("app_channel",)) as agent:
        registrations = [
            await register_workload(agent.address, job, "g", w, connect_timeout_sec=5)
            for job, w in workloads.items()
        ]
        try:
            async with AsyncSnapshotAgentClient(agent.address, call_timeout_sec=10) as client:
                await until(lambda: agent.channels.get("g", "next") is not None, "registered")
                await client.snapshot_and_wait(
                    "next", "g", backend_config=app_channel_config(), timeout_sec=10
                )
                workloads["frozen"].frozen = True
                jobs = [pb.SwitchJob(job_id="frozen", snapshot_timeout_ms=300),
                        pb.SwitchJob(job_id="next")]  # fmt: skip
                began = time.monotonic()
                answer = await client.switch_group("g", "next", 5, jobs=jobs, timeout_sec=30)
                took = time.monotonic() - began
                assert 0.25 < took < 1.5, took
                steps = {(s.job_id, s.kind): s for s in answer.steps}
                snapshot = steps[("frozen", "snapshot")]
                assert snapshot.status == pb.OperationStatus.FAILED
                # Whichever ends it first: the table at the deadline, or the channel.
                assert re.search("deadline exceeded|did not answer", snapshot.error or "")
                assert steps[("next", "restore")].status == pb.OperationStatus.COMPLETE
                assert answer.restored and [j.job_id for j in answer.faulted] == ["frozen"]

                # The late answer leaves the table as it is: the same switch again
                # moves nothing, and a newer one does not touch the faulted job.
                workloads["frozen"].thaw()
                channel = agent.channels.get("g", "frozen")
                assert channel is not None
                await until(lambda: channel.state == "SAVED", "the late answer is heard")
                again = await client.switch_group("g", "next", 6, jobs=jobs, timeout_sec=30)
                assert (again.steps, again.restored) == ([], False)
                assert [j.job_id for j in again.faulted] == ["frozen"]
                assert agent_state(agent, "frozen") is JobState.FAULTED

                with pytest.raises(InvalidArgumentError, match="snapshot_timeout_ms"):
                    await client.switch_group(
                        "g", "next", 7, jobs=[pb.SwitchJob(job_id="frozen",
                                                           snapshot_timeout_ms=-1)],
                        timeout_sec=5,
                    )  # fmt: skip
        finally:
            for workload in workloads.values():
                workload.thaw()
            for registration in registrations:
                await registration.close()
        agent.table.validate()
