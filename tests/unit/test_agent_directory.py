"""The orchestrator asks each agent at most one Status at a time: callers that ask
while a question is in flight share its answer (GetGroupStatus pollers and
ListAgents cannot pile questions up on an agent), a caller that gives up does not
take the answer from the others, and the next question after an answer is new."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from timeslice.client.agent_types import StatusResponse
from timeslice.errors import UnavailableError
from timeslice.orchestrator.agents import AgentDirectory


class SlowAgent:
    """A stand-in agent client whose Status answers after `delay` seconds."""

    def __init__(self, delay: float = 0.05, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail
        self.asked = 0

    async def status(self, timeout_sec: float | None = None) -> StatusResponse:
        self.asked += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise UnavailableError("the agent is down")
        return StatusResponse(job_statuses=[], accelerator_statuses=[], node_name="n1")

    async def close(self) -> None:
        pass


def directory(**agents: Any) -> AgentDirectory:
    found = AgentDirectory()
    found._clients.update(agents)
    return found


async def test_callers_that_ask_meanwhile_share_one_question() -> None:
    agent = SlowAgent()
    agents = directory(a1=agent)
    answers = await asyncio.gather(*(agents.statuses(["a1"]) for _ in range(20)))
    assert agent.asked == 1
    assert all(isinstance(a["a1"], StatusResponse) for a in answers)
    views = await asyncio.gather(*(agents.job_states("g", ["a1"]) for _ in range(5)))
    assert agent.asked == 2 and all(every for _, every in views)
    await agents.statuses(["a1"])  # after an answer, a new question
    assert agent.asked == 3


async def test_a_caller_that_gives_up_leaves_the_answer_to_the_others() -> None:
    agent = SlowAgent(delay=0.2)
    agents = directory(a1=agent)
    quitter = asyncio.ensure_future(agents.status("a1"))
    stayer = asyncio.ensure_future(agents.status("a1"))
    await asyncio.sleep(0.05)
    quitter.cancel()
    assert (await stayer).node_name == "n1" and agent.asked == 1
    with pytest.raises(asyncio.CancelledError):
        await quitter


async def test_a_failed_question_fails_each_caller_and_is_not_kept() -> None:
    agent = SlowAgent(fail=True)
    agents = directory(a1=agent)
    answers = await asyncio.gather(*(agents.statuses(["a1"]) for _ in range(3)))
    assert agent.asked == 1 and all(isinstance(a["a1"], UnavailableError) for a in answers)
    agent.fail = False
    assert isinstance((await agents.statuses(["a1"]))["a1"], StatusResponse)
    assert agent.asked == 2
    await agents.close()
