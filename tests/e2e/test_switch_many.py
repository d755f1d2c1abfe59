"""The whole switch, many times over: one Orchestrator, two Agents (two nodes of
one group), three jobs whose contexts are real host-memory workloads, one on
each node. The jobs take turns on the group until 500 switches have happened.

Each node keeps its own record of which contexts are live, written by the
workloads themselves as the agent moves them: a restore that begins while
another job's context is live on the same node is a violation. Each job writes
a new value into its arrays on both nodes at every turn and checks, at its next
turn, that the restore brought back exactly what it wrote.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path


from recorded_workloads import NodeRecord, RecordedWorkload

from timeslice import Agent, AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.client.workload import register_workload

GROUP = "g"
JOBS = ("job-a", "job-b", "job-c")
SWITCHES = 500
ELEMENTS = 16 * 1024  # 128 KiB per array


async def test_500_switches_over_two_nodes_never_two_live_contexts(tmp_path: Path) -> None:
    records = [NodeRecord("n1"), NodeRecord("n2")]
    rng = random.Random(7)
    async with Orchestrator(group_nodes={GROUP: ("n1", "n2")}) as orch:
        agents = [
            Agent(node_name=r.name, backends=("app_channel",), orchestrator=orch.address)
            for r in records
        ]
        async with agents[0], agents[1]:
            workloads = {
                (job, r.name): RecordedWorkload(job, r, tmp_path / f"{job}-{r.name}")
                for job in JOBS
                for r in records
            }
            registrations = [
                await register_workload(agent.address, job, GROUP, workloads[(job, r.name)])
                for job in JOBS
                for agent, r in zip(agents, records, strict=True)
            ]
            grants: list[tuple[str, bool, int]] = []
            switched = 0

            async def run_job(job: str) -> None:
                async with AsyncTimeSliceOrchestratorClient(
                    orch.address, job_id=job, group_id=GROUP
                ) as client:
                    nonlocal switched
                    turn = 0
                    while switched < SWITCHES:
                        async with client.acquire() as grant:
                            if not grants or grants[-1][0] != job:
                                switched += 1
                            grants.append((job, grant.context_restored, grant.fencing_token))
                            turn += 1
                            for r in records:
                                mine = workloads[(job, r.name)]
                                assert r.live == {job}, (r.name, r.live, job)
                                mine.check_and_write(float(turn))
                            await asyncio.sleep(rng.random() * 0.002)
                        await asyncio.sleep(rng.random() * 0.002)

            await asyncio.wait_for(asyncio.gather(*(run_job(j) for j in JOBS)), 100)
            for registration in registrations:
                await registration.close()

    assert switched >= SWITCHES
    tokens = [token for _, _, token in grants]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    # A grant to another job than the last restored its saved context; a job granted
    # again with nobody in between found its context still live (nothing restored).
    previous = ""
    for job, restored, _ in grants:
        assert restored == (job != previous), (job, previous)
        previous = job
    for r in records:
        assert r.violations == []
        assert r.most_live == 1
        assert r.restores == sum(restored for _, restored, _ in grants)
