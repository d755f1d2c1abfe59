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
from timeslice.orchestrator.state import LockTable

ADDRESS = "127.0.0.1:7001"


class Journaled:
    def __init__(self) -> None:
        self.table = LockTable()
        self.applied: list[ev.Event] = []

    def apply(self, event: ev.Event) -> asyncio.Future[list[ev.Effect]]:
        self.applied.append(event)
        done: asyncio.Future[list[ev.Effect]] = asyncio.get_running_loop().create_future()
        done.set_result([])
        return done


class Agent:
    """Stands in for the agent's client: records when each switch came, and its proof."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, bytes]] = []

    async def switch_group(self, *_: Any, token_proof: bytes, **__: Any) -> apb.SwitchGroupResponse:
        self.calls.append((time.monotonic(), token_proof))
        return apb.SwitchGroupResponse(node_name="n1")

    async def close(self) -> None:
        pass


def driver_of(
    node: str, *, registered: bool, timeout: float = 30.0
) -> tuple[HandoffDriver, Journaled, AgentDirectory, Agent]:
    journaled = Journaled()
    journaled.table.handle(ev.SetGroupNodes(now=1.0, group="g", nodes=(node,)))
    if registered:  # its agent has been in session before: the journal says where it is
        journaled.table.handle(ev.RegisterAgent(now=1.0, node="n1", address=ADDRESS))
    agents = AgentDirectory()
    driver = HandoffDriver(journaled, agents, timeout=timeout)
    agent = Agent()
    driver._clients[ADDRESS] = agent  # type: ignore[assignment]  # noqa: SLF001
    return driver, journaled, agents, agent


async def switch_done(journaled: Journaled) -> ev.SwitchDone:
    while not journaled.applied:
        await asyncio.sleep(0.01)
    [done] = journaled.applied
    assert isinstance(done, ev.SwitchDone)
    return done


async def test_a_switch_waits_for_the_session_of_an_agent_that_keeps_one() -> None:
    for node in ("n1", ADDRESS):  # a group may name its node, or its agent's address
        driver, journaled, agents, agent = driver_of(node, registered=True)
        began = time.monotonic()
        driver.start(ev.SwitchStarted(group="g", job="b", token=3, previous="a"))
        await asyncio.sleep(0.3)
        assert agent.calls == []  # not sent unproven
        key = new_key()
        agents.reported(object(), "n1", ADDRESS, {}, {}, token_key=key)
        done = await switch_done(journaled)
        assert done.error == ""
        [(sent, proof)] = agent.calls
        assert sent - began >= 0.3
        assert proof == token_proof(key, "g", 3, epoch=journaled.table.epoch)
        await driver.close()


async def test_an_agent_in_session_is_not_waited_for() -> None:
    driver, journaled, agents, agent = driver_of("n1", registered=True)
    key = new_key()
    agents.reported(object(), "n1", ADDRESS, {}, {}, token_key=key)
    began = time.monotonic()
    driver.start(ev.SwitchStarted(group="g", job="b", token=3, previous="a"))
    await switch_done(journaled)
    [(sent, proof)] = agent.calls
    assert sent - began < 0.25
    assert proof == token_proof(key, "g", 3, epoch=journaled.table.epoch)
    await driver.close()


async def test_an_agent_reached_at_its_address_only_is_not_waited_for() -> None:
    # Never in session (it reports nothing): nothing to wait for, and no proof to make.
    driver, journaled, _, agent = driver_of(ADDRESS, registered=False)
    began = time.monotonic()
    driver.start(ev.SwitchStarted(group="g", job="b", token=3, previous="a"))
    await switch_done(journaled)
    [(sent, proof)] = agent.calls
    assert sent - began < 0.25
    assert proof == b""
    await driver.close()


async def test_the_wait_for_a_session_is_bounded() -> None:
    # By half the switch's time when that is shorter than SESSION_WAIT...
    driver, journaled, _, agent = driver_of("n1", registered=True, timeout=1.0)
    began = time.monotonic()
    driver.start(ev.SwitchStarted(group="g", job="b", token=3, previous="a"))
    await switch_done(journaled)
    [(sent, proof)] = agent.calls
    assert 0.45 <= sent - began < 0.9
    assert proof == b""  # sent as it is: the agent asks the orchestrator about the token
    await driver.close()
    # ...and by SESSION_WAIT otherwise.
    assert handoff.SESSION_WAIT <= 5.0
    original, handoff.SESSION_WAIT = handoff.SESSION_WAIT, 0.2
    try:
        driver, journaled, _, agent = driver_of("n1", registered=True, timeout=30.0)
        began = time.monotonic()
        driver.start(ev.SwitchStarted(group="g", job="b", token=3, previous="a"))
        await switch_done(journaled)
        [(sent, _)] = agent.calls
        assert 0.15 <= sent - began < 0.6
        await driver.close()
    finally:
        handoff.SESSION_WAIT = original
