"""An agent takes a fencing token new to it only once its orchestrator says it
issued one at least as new: one request with a token from the future would
otherwise make every real command for the group stale, for good."""

from __future__ import annotations

import pytest

from timeslice import Agent, AsyncSnapshotAgentClient, AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.client import named_backend
from timeslice.errors import ConflictError, InvalidArgumentError

pytestmark = pytest.mark.timeout(60)


async def test_a_token_the_orchestrator_never_issued_is_refused_and_changes_nothing() -> None:
    async with (
        Orchestrator() as orch,
        Agent(node_name="n1", backends=("noop",), orchestrator=orch.address, groups=("g",)) as agent,
        AsyncSnapshotAgentClient(agent.address) as client,
        AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as job,
    ):
        await job.register_job(named_backend("noop"), node="n1")
        for token in (2**64 - 1, 2**40):
            with pytest.raises((ConflictError, InvalidArgumentError)):
                await client.snapshot(
                    "a", "g", backend_config=named_backend("noop"), fencing_token=token
                )
        with pytest.raises(ConflictError, match="never issued"):
            await client.switch_group("g", "a", 7, timeout_sec=5)
        assert agent.table.tokens.get("g", 0) == 0
        # A token the orchestrator did issue is taken, and one past it is not.
        grant = await job.acquire(timeout_sec=10)
        await job.release()
        with pytest.raises(ConflictError, match="never issued"):
            await client.snapshot(
                "b", "g", backend_config=named_backend("noop"), fencing_token=grant.fencing_token + 1
            )
        done = await client.snapshot_and_wait(
            "b", "g", backend_config=named_backend("noop"), fencing_token=grant.fencing_token
        )
        assert done.status == "OPERATION_STATUS_COMPLETE"
        assert agent.table.tokens["g"] == grant.fencing_token


async def test_an_agent_without_an_orchestrator_takes_tokens_as_sent() -> None:
    async with (
        Agent(node_name="n1", backends=("noop",)) as agent,
        AsyncSnapshotAgentClient(agent.address) as client,
    ):
        await client.snapshot_and_wait("a", "g", backend_config=named_backend("noop"), fencing_token=9)
        assert agent.table.tokens["g"] == 9
        with pytest.raises(InvalidArgumentError):
            await client.restore("a", "g", fencing_token=2**63)
