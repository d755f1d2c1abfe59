"""An agent takes a fencing token new to it only once its orchestrator says it
issued one at least as new: one request with a token from the future would
otherwise make every real command for the group stale, for good."""

from __future__ import annotations

import asyncio
import time

import pytest
from grpclib.client import Channel

from tests.faults.proxy import Proxy
from timeslice import (
    Agent,
    AsyncSnapshotAgentClient,
    AsyncTimeSliceOrchestratorClient,
    Orchestrator,
)
from timeslice.client import named_backend
from timeslice.errors import ConflictError, InvalidArgumentError
from timeslice.fencing import new_key, token_proof

pytestmark = pytest.mark.timeout(60)


async def taken(client: AsyncSnapshotAgentClient, agent: Agent, token: int) -> None:
    """A snapshot of job b of group g with `token` is done, and the token taken."""
    done = await client.snapshot_and_wait(
        "b", "g", backend_config=named_backend("noop"), fencing_token=token
    )
    assert done.status == "OPERATION_STATUS_COMPLETE"
    assert agent.table.tokens["g"] == token


async def refused(client: AsyncSnapshotAgentClient, token: int) -> None:
    """A snapshot of job b of group g with `token` is refused: never issued."""
    with pytest.raises(ConflictError, match="never issued"):
        await client.snapshot("b", "g", backend_config=named_backend("noop"), fencing_token=token)


async def test_a_token_the_orchestrator_never_issued_is_refused_and_changes_nothing() -> None:
    async with (
        Orchestrator() as orch,
        Agent(
            node_name="n1", backends=("noop",), orchestrator=orch.address, groups=("g",)
        ) as agent,
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
        for i in range(20):  # groups the orchestrator does not know leave nothing behind
            with pytest.raises(ConflictError):
                await client.snapshot(
                    "a", f"x{i}", backend_config=named_backend("noop"), fencing_token=5
                )
        assert agent._issued_tokens == {}
        # A token the orchestrator did issue is taken, and one past it is not.
        grant = await job.acquire(timeout_sec=10)
        await job.release()
        await refused(client, grant.fencing_token + 1)
        await taken(client, agent, grant.fencing_token)


async def test_an_agent_without_an_orchestrator_takes_tokens_as_sent() -> None:
    async with (
        Agent(node_name="n1", backends=("noop",)) as agent,
        AsyncSnapshotAgentClient(agent.address) as client,
    ):
        await client.snapshot_and_wait(
            "a", "g", backend_config=named_backend("noop"), fencing_token=9
        )
        assert agent.table.tokens["g"] == 9
        with pytest.raises(InvalidArgumentError):
            await client.restore("a", "g", fencing_token=2**63)


@pytest.mark.parametrize("by_address", [False, True], ids=["node name", "agent address"])
async def test_the_orchestrators_switches_prove_their_tokens_and_are_not_asked_about(
    by_address: bool, free_port: int
) -> None:
    address = f"127.0.0.1:{free_port}"
    node = address if by_address else "n1"
    async with (
        Orchestrator(group_nodes={"g": (node,)}) as orch,
        Agent(
            node_name="n1", backends=("noop",), orchestrator=orch.address, port=free_port
        ) as agent,
        AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as a,
        AsyncTimeSliceOrchestratorClient(orch.address, "b", "g") as b,
        AsyncSnapshotAgentClient(agent.address) as client,
    ):
        while not orch.agents.token_key("n1"):  # the agent's session is up
            await asyncio.sleep(0.01)
        for job in (a, b):
            await job.register_job(named_backend("noop"), node=node)
        for _ in range(3):
            for job in (a, b):
                async with job.acquire(timeout_sec=10):
                    pass
        assert agent.table.tokens["g"] == 6  # every switch's token was taken...
        assert agent._link is not None and agent._link._client is None  # ...unasked
        # A proof made with another key proves nothing: the token is checked by asking.
        forged = token_proof(new_key(), "g", 99, epoch=orch.table.epoch)
        with pytest.raises(ConflictError, match="never issued"):
            await client.switch_group("g", "a", 99, timeout_sec=5, token_proof=forged)
        assert agent.table.tokens["g"] == 6


async def test_a_token_is_asked_about_on_the_session_not_of_a_frozen_candidate_before_it() -> None:
    """The agent's target lists a frozen orchestrator first: its session has left
    that one for the next, and so does the question whether a token was issued
    (asked of the target's candidates in turn, it would wait for the frozen one's
    pings to fail first: 2 s)."""
    async with Orchestrator() as stuck, Orchestrator() as orch:
        host, _, port = stuck.address.rpartition(":")
        frozen = Proxy(host, int(port))
        await frozen.start()
        frozen.cut()  # connections open, nothing answered
        try:
            async with (
                Agent(
                    node_name="n1",
                    backends=("noop",),
                    orchestrator=f"127.0.0.1:{frozen.port},{orch.address}",
                ) as agent,
                AsyncSnapshotAgentClient(agent.address) as client,
                AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as job,
            ):
                while not orch.agents.token_key("n1"):  # the session is on `orch`
                    await asyncio.sleep(0.01)
                grant = await job.acquire(timeout_sec=10)  # g has no node: nothing proven
                await job.release()
                began = time.monotonic()
                await taken(client, agent, grant.fencing_token)
                took = time.monotonic() - began
                assert took < 1.0, f"the token check took {took:.2f} s"
                await refused(client, grant.fencing_token + 1)
                assert agent._link is not None and agent._link._client is None
        finally:
            await frozen.close()


async def test_a_token_question_the_sessions_connection_fails_goes_to_the_candidates(
    free_port: int,
) -> None:
    async with (
        Orchestrator() as orch,
        Agent(node_name="n1", backends=("noop",), orchestrator=orch.address) as agent,
        AsyncSnapshotAgentClient(agent.address) as client,
        AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as job,
    ):
        link = agent._link
        assert link is not None
        while link._session_channel is None:
            await asyncio.sleep(0.01)
        grant = await job.acquire(timeout_sec=10)
        await job.release()
        # As if the session's connection broke just as the question was asked.
        dead = link._session_channel = Channel("127.0.0.1", free_port)  # nothing listens
        try:
            await taken(client, agent, grant.fencing_token)
        finally:
            dead.close()
        assert link._client is not None  # asked of the target's candidates
