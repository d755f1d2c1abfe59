"""GetGroupStatus on a group whose agents keep a session is answered from what they
report and from their answers to switches: no agent is asked anything per call."""

from __future__ import annotations

import asyncio

import pytest

from tests.waiting import until
from timeslice import Agent, AsyncSnapshotAgentClient, Orchestrator
from timeslice.agent.service import AgentService
from timeslice.client import AsyncTimeSliceOrchestratorClient, named_backend

pytestmark = pytest.mark.timeout(60)


def states(status: object) -> dict[str, str]:
    return {s.job_id: s.job_state.value for s in status.agent_job_states}  # type: ignore[attr-defined]


async def test_status_polls_ask_no_agent_in_session_and_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = 0
    status = AgentService.status

    async def counted(self: AgentService, message: object) -> object:
        nonlocal asked
        asked += 1
        return await status(self, message)  # type: ignore[arg-type]

    monkeypatch.setattr(AgentService, "status", counted)
    async with (
        Orchestrator() as orch,
        Agent(
            node_name="n1", backends=("noop",), orchestrator=orch.address, groups=("g",)
        ) as agent,
        AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as a,
        AsyncTimeSliceOrchestratorClient(orch.address, "b", "g") as b,
    ):
        for job in (a, b):
            await job.register_job(named_backend("noop"), node="n1")
        await until(lambda: orch.agents.in_session("n1"), "the agent in session")
        await a.acquire(timeout_sec=10)
        waiting = asyncio.ensure_future(b.acquire(timeout_sec=10))
        await until(lambda: "b" in orch.table.groups["g"].queue, "b waits")
        await a.release()
        grant = await waiting
        # The very moment b's Acquire returns, the status says where both contexts are.
        assert states(await a.get_status()) == {"a": "SAVED", "b": "RUNNING"}
        for _ in range(50):
            assert states(await a.get_status()) == {"a": "SAVED", "b": "RUNNING"}
        assert asked == 0

        # A change the orchestrator did not make is reported by the agent's session.
        async with AsyncSnapshotAgentClient(agent.address) as direct:
            await direct.snapshot_and_wait(
                "c", "g", backend_config=named_backend("noop"), fencing_token=grant.fencing_token
            )
        seen: dict[str, str] = {}

        async def c_saved() -> None:
            nonlocal seen
            while (seen := states(await a.get_status())).get("c") != "SAVED":
                await asyncio.sleep(0.01)

        await asyncio.wait_for(c_saved(), 5)
        assert seen == {"a": "SAVED", "b": "RUNNING", "c": "SAVED"}
        assert asked == 0

        await agent.close()  # its session ends: the orchestrator asks, and cannot reach it
        await until(lambda: not orch.agents.in_session("n1"), "the session over")
        answer = await a.get_status()
        assert answer.group.group_state.value == "UNKNOWN"
        assert states(answer) == {}
