"""GetGroupStatus on a group whose agents keep a session is answered from what they
report and from their answers to switches: no agent is asked anything per call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from grpclib.client import Channel

from tests.waiting import until
from timeslice import Agent, AsyncSnapshotAgentClient, Orchestrator
from timeslice.agent import link as link_module
from timeslice.agent.link import STATE_REPORT_DELAY
from timeslice.agent.service import AgentService
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as opb
from timeslice.client import AsyncTimeSliceOrchestratorClient, named_backend

pytestmark = pytest.mark.timeout(60)


def states(status: object) -> dict[str, str]:
    return {s.job_id: s.job_state.value for s in status.agent_job_states}  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def two_jobs_on_an_agent_in_session() -> AsyncIterator[
    tuple[Orchestrator, Agent, AsyncTimeSliceOrchestratorClient, AsyncTimeSliceOrchestratorClient]
]:
    """An orchestrator, an agent of node n1 in session with it, and jobs a and b of
    group g (on n1, with the noop backend)."""
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
        yield orch, agent, a, b


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
    async with two_jobs_on_an_agent_in_session() as (orch, agent, a, b):
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


async def test_a_report_is_built_only_to_be_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each switch changes the job table three times on every agent; the session
    hears of each change at once but builds and sends a report only when one is
    due (what the orchestrator acts on changed, or `STATE_REPORT_DELAY` after a
    change of states alone), so that a switch costs the agent no report of its own."""
    built = 0
    job_status = link_module.job_status

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal built
        built += 1
        return job_status(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(link_module, "job_status", counted)
    async with two_jobs_on_an_agent_in_session() as (orch, agent, a, b):
        link = agent._link
        assert link is not None
        await a.acquire(timeout_sec=10)
        await a.release()
        await asyncio.sleep(3 * STATE_REPORT_DELAY)  # the first switch's states reported
        before_built, before_sent = built, link.reports_sent
        changes = agent.table.version
        for _ in range(10):  # b, then a, and so on: a switch each
            for job in (b, a):
                await job.acquire(timeout_sec=10)
                await job.release()
        assert agent.table.version - changes >= 60  # three changes a switch, at least
        await asyncio.sleep(3 * STATE_REPORT_DELAY)  # the last switches' states reported
        assert states(await a.get_status()) == {"a": "RUNNING", "b": "SAVED"}
        sent = link.reports_sent - before_sent
        assert 1 <= sent <= 5  # the states of 20 switches, in a report or a few
        assert built - before_built == 2 * sent  # two jobs in each report, no more built


# An agent may name a job state this orchestrator does not know: a newer agent's, or
# one a hostile agent made up (the fuzzer's -1). Proto3 enums are open, so the value
# decodes; the status shows such a job as STATE_UNSPECIFIED and every other job as
# said, rather than failing every caller's GetGroupStatus of the group.
SAID = {"known": apb.JobState.SAVED, "negative": apb.JobState(-1), "newer": apb.JobState(99)}
SHOWN = {"known": "SAVED", "negative": "UNSPECIFIED", "newer": "UNSPECIFIED"}


def said_jobs() -> list[apb.JobStatus]:
    return [apb.JobStatus(job_id=job, group="g", state=state) for job, state in SAID.items()]


async def test_a_job_state_unknown_here_is_shown_unspecified_from_a_session() -> None:
    async with Orchestrator() as orch:
        host, port = orch.address.rsplit(":", 1)
        channel = Channel(host, int(port))
        leave = asyncio.Event()

        async def reports() -> AsyncIterator[opb.AgentReport]:
            yield opb.AgentReport(
                node_name="n1",
                address="127.0.0.1:1",
                groups=["g"],
                table_version=1,
                jobs=said_jobs(),
            )
            await leave.wait()

        session = asyncio.ensure_future(
            opb.TimeSliceOrchestratorServiceStub(channel).agent_session(reports())
        )
        try:
            await until(lambda: orch.agents.in_session("n1"), "the session open")
            async with AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as a:
                assert states(await a.get_status()) == SHOWN
        finally:
            leave.set()
            await asyncio.wait_for(session, 5)
            channel.close()


async def test_a_job_state_unknown_here_is_shown_unspecified_from_a_status_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def made_up(self: AgentService, message: object) -> apb.StatusResponse:
        return apb.StatusResponse(node_name="n1", job_statuses=said_jobs())

    monkeypatch.setattr(AgentService, "status", made_up)
    async with (
        Orchestrator() as orch,
        Agent(node_name="n1", backends=("noop",)) as agent,  # no session: it is asked
        AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as a,
    ):
        await a.set_group_nodes([agent.address])
        answer = await a.get_status()
        assert answer.group.group_state.value != "UNKNOWN"  # the agent answered
        assert states(answer) == SHOWN
