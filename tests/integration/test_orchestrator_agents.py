"""A group names the agents of its nodes: GetGroupStatus reports what they say of
the group's jobs, and STATE_UNKNOWN when one of them cannot be reached."""

from __future__ import annotations

import pytest
from orchestrator_wire import orchestrator_stub, status_of

from timeslice import Agent, AsyncSnapshotAgentClient, Orchestrator
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client import named_backend
from timeslice.errors import InvalidArgumentError

State = pb.GroupStatusState
JobState = pb.SnapshotAgentJobStateState


async def test_group_status_reports_each_agents_view_of_the_groups_jobs(free_port: int) -> None:
    async with (
        Agent(node_name="node-a", backends=("noop",)) as a,
        Agent(node_name="node-b", backends=("noop",), port=free_port) as b,
    ):
        async with AsyncSnapshotAgentClient(a.address) as client:
            await client.snapshot_and_wait("saved", "g", backend_config=named_backend("noop"))
            await client.snapshot_and_wait("other", "h", backend_config=named_backend("noop"))
        async with AsyncSnapshotAgentClient(b.address) as client:
            await client.snapshot_and_wait("live", "g", backend_config=named_backend("noop"))
            await client.restore_and_wait("live", "g")
        nodes = {"g": (a.address, b.address)}
        async with Orchestrator(group_nodes=nodes) as orch, orchestrator_stub(orch.address) as stub:
            await stub.acquire(pb.AcquireRequest(job_id="live", group_id="g"))
            answer = await stub.get_group_status(pb.GetGroupStatusRequest(group_id="g"))
            assert answer.group.group_state == State.LOCKED
            seen = {(s.agent, s.job_id, s.job_state) for s in answer.agent_job_states}
            assert seen == {
                ("node-a", "saved", JobState.SAVED),
                ("node-b", "live", JobState.RUNNING),
            }

            await b.close()  # a node's agent goes away
            answer = await stub.get_group_status(pb.GetGroupStatusRequest(group_id="g"))
            assert answer.group.group_state == State.UNKNOWN
            assert answer.group.locking_job == "live"  # the lock itself is unchanged
            assert {s.agent for s in answer.agent_job_states} == {"node-a"}
            # a group with no nodes named is answered from the lock table alone
            await stub.acquire(pb.AcquireRequest(job_id="x", group_id="alone"))
            assert (await status_of(stub, "alone")).group_state == State.LOCKED


@pytest.mark.parametrize(
    "nodes", [{"g": ("not an address",)}, {"": ("127.0.0.1:9001",)}, {"g": ("host:99999",)}]
)
def test_bad_group_nodes_are_refused(nodes: dict[str, tuple[str, ...]]) -> None:
    with pytest.raises(InvalidArgumentError):
        Orchestrator(group_nodes=nodes)


@pytest.mark.parametrize("value", ["g", "g=", "=127.0.0.1:1", "g=no where", "g=host:99999"])
def test_serve_refuses_bad_group_nodes(value: str) -> None:
    from typer.testing import CliRunner

    from timeslice.cli import app

    result = CliRunner().invoke(
        app, ["serve", "orchestrator", "--port", "0", "--db", "memory", "--group-nodes", value]
    )
    assert result.exit_code == 2, result.output
