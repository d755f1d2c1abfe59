"""Every command the orchestrator sends an agent carries its epoch: the agent
takes a newer epoch only when proven (or vouched for by its orchestrator), keeps
the highest, and refuses a switch or a reset of a lower one, so that an
orchestrator that has been replaced on its journal moves nothing. In-process
servers on 127.0.0.1, the journal in SQLite (a restart raises the epoch)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from timeslice import (
    Agent,
    AsyncSnapshotAgentClient,
    AsyncTimeSliceOrchestratorClient,
    Orchestrator,
)
from timeslice.client import named_backend
from timeslice.errors import ConflictError
from timeslice.fencing import new_key, token_proof

pytestmark = pytest.mark.timeout(60)
NOOP = named_backend("noop")


async def switch_once(orch: Orchestrator, job: str) -> int:
    """`job` holds group "g" once (its context switched in on the group's node)."""
    async with AsyncTimeSliceOrchestratorClient(orch.address, job, "g") as client:
        await client.register_job(NOOP, node="n1")
        grant = await client.acquire(timeout_sec=10)
        await client.release()
        return grant.fencing_token


async def in_session(orch: Orchestrator) -> None:
    while not orch.agents.token_key("n1"):
        await asyncio.sleep(0.01)


async def test_the_orchestrators_switches_carry_its_epoch_proven_and_unasked() -> None:
    async with (
        Orchestrator(group_nodes={"g": ("n1",)}) as orch,
        Agent(node_name="n1", backends=("noop",), orchestrator=orch.address) as agent,
        AsyncSnapshotAgentClient(agent.address) as client,
    ):
        await in_session(orch)
        token = await switch_once(orch, "a")
        assert orch.table.epoch > 0
        assert agent.table.orchestrator_epoch == orch.table.epoch
        assert agent._link is not None and agent._link._client is None  # never asked

        # An epoch the orchestrator never reached is refused and not taken, with a
        # forged proof (then asked) or none, on a switch and on a reset.
        future = orch.table.epoch + 5
        forged = token_proof(new_key(), "g", token, epoch=future)
        for proof in (forged, b""):
            with pytest.raises(ConflictError, match="epoch .* was never reached"):
                await client.switch_group(
                    "g", "a", token, timeout_sec=5, token_proof=proof, orchestrator_epoch=future
                )
        with pytest.raises(ConflictError, match="was never reached"):
            await client.reset_job("a", "g", orchestrator_epoch=future)
        assert agent.table.orchestrator_epoch == orch.table.epoch
        # An operator's call (epoch 0) is not fenced by epoch.
        await client.switch_group("g", "a", token, timeout_sec=5)


async def test_an_agent_refuses_the_epoch_of_an_orchestrator_replaced_on_its_journal(
    tmp_path: Path, free_port: int
) -> None:
    options = {"db": f"sqlite:///{tmp_path / 'journal.db'}", "group_nodes": {"g": ("n1",)}}
    target = f"127.0.0.1:{free_port}"
    async with Orchestrator(port=free_port, **options) as first:
        agent = Agent(node_name="n1", backends=("noop",), orchestrator=target)
        async with agent, AsyncSnapshotAgentClient(agent.address) as client:
            await in_session(first)
            await switch_once(first, "a")
            old = first.table.epoch
            await first.close()
            async with Orchestrator(port=free_port, **options) as second:
                await in_session(second)
                token = await switch_once(second, "b")
                assert second.table.epoch > old
                assert agent.table.orchestrator_epoch == second.table.epoch
                operations = len(agent.table.operations)
                assert agent._link is not None
                proof = token_proof(agent._link.token_key, "g", token, epoch=old)
                refused = (
                    f"^a command of orchestrator epoch {old}, but epoch"
                    f" {second.table.epoch} has taken over: refused$"
                )
                with pytest.raises(ConflictError, match=refused):
                    await client.switch_group(
                        "g", "a", token, timeout_sec=5, token_proof=proof, orchestrator_epoch=old
                    )
                with pytest.raises(ConflictError, match=refused):
                    await client.reset_job("a", "g", orchestrator_epoch=old)
                assert len(agent.table.operations) == operations
                assert agent.table.job("g", "a").state.value == "SAVED"  # not restored
