"""A switch proves its token with the key the node's agent gave in its session. An
agent that keeps a session but has none open (the orchestrator has just started or
taken over) is waited for a little, so that its switch carries that proof rather
than leaving the agent to ask an orchestrator (perhaps a frozen one) about the token."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.fencing import new_key, token_proof
from timeslice.orchestrator import events as ev
from timeslice.orchestrator import handoff
from timeslice.orchestrator.agents import AgentDirectory
from timeslice.orchestrator.handoff import HandoffDriver

from tests.unit.test_switch_jobs import Recording

ADDRESS = "127.0.0.1:7001"
TOKEN = 3


class Agent:
    """Stands in for the agent's client: records when each switch came, and its proof."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, bytes]] = []

    async def switch_group(self, *_: Any, token_proof: bytes, **__: Any) -> apb.SwitchGroupResponse:
        self.calls.append((time.monotonic(), token_proof))
        return apb.SwitchGroupResponse(node_name="n1")

    async def close(self) -> None:
        pass


class Node:
    """A driver whose group spans one node (`node`: its name, or its agent's address),
    the node's agent registered by an earlier session (`registered`) or not."""

    def __init__(self, node: str, *, registered: bool, timeout: float = 30.0) -> None:
        self.journaled = Recording()
        self.journaled.table.handle(ev.SetGroupNodes(now=1.0, group="g", nodes=(node,)))
        if registered:  # the journal says where it is
            self.journaled.table.handle(ev.RegisterAgent(now=1.0, node="n1", address=ADDRESS))
        self.agents = AgentDirectory()
        self.driver = HandoffDriver(self.journaled, self.agents, timeout=timeout)
        self.agent = Agent()
        self.driver._clients[ADDRESS] = self.agent  # type: ignore[assignment]  # noqa: SLF001

    def session(self) -> bytes:
        """The agent opens its session; the key it sends."""
        key = new_key()
        self.agents.reported(object(), "n1", ADDRESS, {}, {}, token_key=key)
        return key

    def proof(self, key: bytes) -> bytes:
        return token_proof(key, "g", TOKEN, epoch=self.journaled.table.epoch)

    async def switch(self, session_after: float | None = None) -> tuple[float, bytes]:
        """Run a switch to its end (the agent opening its session `session_after`
        seconds into it): how long after its start the node was asked, and the proof
        it was sent."""
        began = time.monotonic()
        self.driver.start(ev.SwitchStarted(group="g", job="b", token=TOKEN, previous="a"))
        if session_after is not None:
            await asyncio.sleep(session_after)
            assert self.agent.calls == []  # not sent unproven meanwhile
            self.session()
        while not self.journaled.applied:
            await asyncio.sleep(0.01)
        [done] = self.journaled.applied
        assert isinstance(done, ev.SwitchDone) and done.error == ""
        [(sent, proof)] = self.agent.calls
        await self.driver.close()
        return sent - began, proof


async def test_a_switch_waits_for_the_session_of_an_agent_that_keeps_one() -> None:
    for name in ("n1", ADDRESS):  # a group may name its node, or its agent's address
        node = Node(name, registered=True)
        after, proof = await node.switch(session_after=0.3)
        assert after >= 0.3
        key = node.agents.token_key("n1")
        assert key and proof == node.proof(key)


async def test_an_agent_in_session_is_not_waited_for() -> None:
    node = Node("n1", registered=True)
    key = node.session()
    after, proof = await node.switch()
    assert after < 0.25
    assert proof == node.proof(key)


async def test_an_agent_reached_at_its_address_only_is_not_waited_for() -> None:
    # Never in session (it reports nothing): nothing to wait for, and no proof to make.
    after, proof = await Node(ADDRESS, registered=False).switch()
    assert after < 0.25
    assert proof == b""


async def test_the_wait_for_a_session_is_bounded() -> None:
    # By half the switch's time when that is shorter than SESSION_WAIT...
    after, proof = await Node("n1", registered=True, timeout=1.0).switch()
    assert 0.45 <= after < 0.9
    assert proof == b""  # sent as it is: the agent asks the orchestrator about the token
    # ...and by SESSION_WAIT otherwise.
    assert handoff.SESSION_WAIT <= 5.0
    original, handoff.SESSION_WAIT = handoff.SESSION_WAIT, 0.2
    try:
        after, _ = await Node("n1", registered=True, timeout=30.0).switch()
        assert 0.15 <= after < 0.6
    finally:
        handoff.SESSION_WAIT = original
