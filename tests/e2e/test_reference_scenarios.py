"""The two scenarios the v1alpha1 reference system is demonstrated with, run
through the blocking client (the v1alpha1 names) against an Orchestrator whose
groups span an Agent each, with real host-memory workloads as the contexts.

1. One RL job alone: it registers its workloads, then loops: acquire the sampler
   group, generate, yield; acquire the trainer group, train, yield. Alone, its
   contexts never have to move: after the first grant every acquire is free.
2. Two queued RL jobs on one sampler group: A holds while sampling; the status
   shows locking=A, queue depth 1, loaded=A; A yields; B runs with its context
   restored; both finish.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from timeslice import Agent, Orchestrator, TimeSliceOrchestratorClient
from timeslice.client.types import GroupLockState, GroupStatus
from timeslice.client.workload import register_workload
from timeslice.workloads import HostMemoryWorkload


def workload(store: Path, value: float) -> HostMemoryWorkload:
    memory = HostMemoryWorkload(store)
    memory.allocate("weights", 4096, np.float64)[:] = value
    return memory


async def test_one_rl_job_alone_loops_over_sampler_and_trainer(tmp_path: Path) -> None:
    nodes = {"sampler": ("n-sampler",), "trainer": ("n-trainer",)}
    async with Orchestrator(group_nodes=nodes) as orch:
        sampler = Agent(node_name="n-sampler", backends=("app_channel",), orchestrator=orch.address)
        trainer = Agent(node_name="n-trainer", backends=("app_channel",), orchestrator=orch.address)
        async with sampler, trainer:
            memories = {g: workload(tmp_path / g, 1.0) for g in nodes}
            registrations = [
                await register_workload(sampler.address, "rl-job", "sampler", memories["sampler"]),
                await register_workload(trainer.address, "rl-job", "trainer", memories["trainer"]),
            ]

            def rl_job() -> list[tuple[str, bool, str]]:
                seen = []
                with TimeSliceOrchestratorClient(orch.address, job_id="rl-job") as client:
                    for step in range(5):
                        for group in ("sampler", "trainer"):
                            result = client.acquire(group_id=group)
                            assert result.success
                            memories[group]["weights"][:] += 1  # the phase's work
                            client.release(group_id=group)
                            state = client.get_status(group_id=group).group.group_state
                            seen.append((group, result.context_restored, state.value))
                    del step
                return seen

            seen = await asyncio.to_thread(rl_job)
            for registration in registrations:
                await registration.close()
    # Alone, nothing is ever moved: every grant is the zero-cost one, and each
    # group rests IDLE_YIELDED with the job's context live.
    assert seen == [(g, False, "IDLE_YIELDED") for _ in range(5) for g in ("sampler", "trainer")]
    assert all(float(m["weights"][0]) == 6.0 for m in memories.values())


async def test_two_queued_rl_jobs_take_turns_on_the_sampler(tmp_path: Path) -> None:
    async with Orchestrator(group_nodes={"sampler": ("n1",)}) as orch:
        async with Agent(
            node_name="n1", backends=("app_channel",), orchestrator=orch.address
        ) as agent:
            memories = {
                job: workload(tmp_path / job, value) for job, value in (("A", 1.0), ("B", 2.0))
            }
            registrations = [
                await register_workload(agent.address, job, "sampler", memories[job])
                for job in ("A", "B")
            ]
            a = TimeSliceOrchestratorClient(orch.address, job_id="A", group_id="sampler")
            b = TimeSliceOrchestratorClient(orch.address, job_id="B", group_id="sampler")
            try:
                first = await asyncio.to_thread(a.acquire)
                assert first.success and not first.context_restored  # A's context was live
                assert memories["B"].state == "SAVED"  # B's was moved out for A
                b_waits = asyncio.ensure_future(asyncio.to_thread(b.acquire))
                status = await _wait_for_queue(a)
                assert status.locking_job == "A"
                assert status.waiter_queue_depth == 1
                assert status.loaded_job == "A"
                assert status.group_state == GroupLockState.LOCKED
                assert not b_waits.done()

                memories["A"]["weights"][:] = 10.0  # A samples
                answer = await asyncio.to_thread(a.release)
                assert answer.success and answer.pending_waiters == 1
                assert not answer.snapshot_deferred
                second = await asyncio.wait_for(b_waits, 10)
                assert second.success and second.context_restored
                assert memories["A"].state == "SAVED"
                assert float(memories["B"]["weights"][0]) == 2.0  # B's bytes came back
                memories["B"]["weights"][:] = 20.0  # B samples
                assert (await asyncio.to_thread(b.release)).snapshot_deferred
                status = (await asyncio.to_thread(b.get_status)).group
                assert (status.group_state, status.active_job, status.loaded_job) == (
                    GroupLockState.IDLE_YIELDED,
                    "B",
                    "B",
                )
                # A's turn again: its context comes back as it left it.
                again = await asyncio.to_thread(a.acquire)
                assert again.context_restored
                assert float(memories["A"]["weights"][0]) == 10.0
                await asyncio.to_thread(a.release)
            finally:
                a.close()
                b.close()
                for registration in registrations:
                    await registration.close()


async def _wait_for_queue(client: TimeSliceOrchestratorClient) -> GroupStatus:
    for _ in range(200):
        status = (await asyncio.to_thread(client.get_status)).group
        if status.waiter_queue_depth:
            return status
        await asyncio.sleep(0.01)
    raise AssertionError("B never queued")
