"""A node's part of a switch (`SwitchGroup`), the liveness the agent reports of its
jobs' workloads, and the agent's own session with the orchestrator: over real
gRPC on 127.0.0.1, with in-process agents and orchestrators.

SwitchGroup snapshots every other live context of a group and restores the next
job's, each step an ordinary operation carrying the group's fencing token; it is
idempotent, refuses an older token, waits for operations already moving the
group's jobs, and goes on past a step that fails (its job FAULTED). Agents that
name an orchestrator register with it, join their groups, report each change,
and reconnect by themselves; a holder whose workload every agent reports gone
loses the group to the next waiter.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import grpclib.client
import numpy as np
import numpy.typing as npt
import pytest
from agent_wire import (
    STREAM_ENDED,
    JobState,
    MiB,
    OpStatus,
    agent_stubs,
    jobs,
    registered,
    run_operation,
    snapshot,
    wait_for_job,
    wait_until_forgotten,
)
from grpclib.const import Cardinality
from orchestrator_wire import split_address

from tests.fakes.fake_cuda import FakeCuda, FakeNvml
from tests.waiting import until
from timeslice.agent import state as st
from timeslice.agent.server import Agent
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import BackendContext
from timeslice.backends.cuda import CudaBackend
from timeslice.client import AsyncSnapshotAgentClient, app_channel_config, named_backend
from timeslice.client.workload import WORKLOAD_CHANNEL
from timeslice.errors import ConflictError, InvalidArgumentError, LeaseLostError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.server import Notice, Orchestrator
from timeslice.workloads import ArraySavedError, HostMemoryWorkload

pytestmark = pytest.mark.timeout(30)

Stub = pb.SnapshotAgentServiceStub
Liveness = pb.Liveness
NOOP = named_backend("noop")
SWITCH_TIMEOUT = 10.0
COMPLETE, FAILED = OpStatus.COMPLETE, OpStatus.FAILED


# --- helpers ---------------------------------------------------------------------------


async def running_noop(client: AsyncSnapshotAgentClient, job: str, group: str) -> None:
    """A noop job whose context is live (snapshotted once, then restored, token 0)."""
    await client.snapshot_and_wait(job, group, backend_config=NOOP, timeout_sec=10)
    await client.restore_and_wait(job, group, timeout_sec=10)


def steps_of(answer: pb.SwitchGroupResponse) -> dict[tuple[str, str], pb.SwitchStep]:
    steps = {(s.job_id, s.kind): s for s in answer.steps}
    assert len(steps) == len(answer.steps), f"a job moved twice: {answer.steps}"
    return steps


def table_states(agent: Agent) -> dict[tuple[str, str], str]:
    return {key: job.state.value for key, job in agent.table.jobs.items()}


def filled(store: Path, seed: int) -> tuple[HostMemoryWorkload, dict[str, npt.NDArray[Any]]]:
    """A host-memory workload of 4 MiB of seeded random bytes, and a copy of them."""
    rng = np.random.default_rng(seed)
    expected: dict[str, npt.NDArray[Any]] = {
        "weights": rng.integers(0, 256, 3 * MiB, dtype=np.uint8),
        "kv_cache": rng.standard_normal(MiB // 4).astype(np.float32),
    }
    memory = HostMemoryWorkload(store)
    for name, array in expected.items():
        memory.add(name, array, tags=(name,))
    return memory, expected


def intact(memory: HostMemoryWorkload, expected: dict[str, npt.NDArray[Any]]) -> bool:
    return all(np.array_equal(memory[name], array) for name, array in expected.items())


def noop_callbacks() -> dict[str, Any]:
    """Callbacks of a workload that moves nothing."""

    def on_snapshot(mode: str, tags: list[str]) -> None:
        return None

    def on_restore(tags: list[str]) -> None:
        return None

    return {"on_snapshot": on_snapshot, "on_restore": on_restore}


@pytest.fixture
async def client(agent: Agent) -> AsyncIterator[AsyncSnapshotAgentClient]:
    async with AsyncSnapshotAgentClient(agent.address, call_timeout_sec=10) as running:
        yield running


@pytest.fixture
async def stub(agent: Agent) -> AsyncIterator[Stub]:
    async with agent_stubs(agent.address) as stubs:
        yield stubs.agent


# --- SwitchGroup with the noop backend -------------------------------------------------


async def test_a_switch_moves_the_groups_live_jobs_out_and_the_next_one_in(
    agent: Agent, client: AsyncSnapshotAgentClient, stub: Stub
) -> None:
    for job in ("a", "b"):
        await running_noop(client, job, "g")
    await client.snapshot_and_wait("c", "g", backend_config=NOOP, timeout_sec=10)
    await running_noop(client, "x", "h")  # another group's
    await running_noop(client, "free", "")  # groupless: the orchestrator names it g's
    await running_noop(client, "stray", "")  # groupless, named by nobody
    named = [
        pb.SwitchJob(job_id="a"),
        pb.SwitchJob(job_id="b"),
        pb.SwitchJob(job_id="c"),
        pb.SwitchJob(job_id="free"),
        # Registered with a backend but never seen here: live since it started.
        pb.SwitchJob(job_id="fresh", backend_config=NOOP),
        # A backend config the backend refuses: no operation, the others go on.
        pb.SwitchJob(job_id="bad", backend_config=named_backend("noop", color="red")),
        # Registered with no backend and unknown here: nothing to move.
        pb.SwitchJob(job_id="nobody"),
    ]

    answer = await client.switch_group("g", "c", 5, jobs=named, timeout_sec=SWITCH_TIMEOUT)

    steps = steps_of(answer)
    moved = {("a", "snapshot"), ("b", "snapshot"), ("free", "snapshot"),
             ("fresh", "snapshot"), ("c", "restore")}  # fmt: skip
    assert set(steps) == moved | {("bad", "snapshot")}
    for key in moved:
        step = steps[key]
        assert (step.status, step.error or "", step.storage_bytes) == (COMPLETE, "", 0), step
        op = agent.table.operations[step.operation_id]
        assert (op.job, op.kind, op.token, op.status.value) == (key[0], key[1], 5, "COMPLETE")
    bad = steps[("bad", "snapshot")]
    assert (bad.status, bad.operation_id) == (FAILED, "")
    assert "takes no options" in (bad.error or "")
    assert (answer.restored, answer.next_state, answer.faulted) == (True, JobState.RUNNING, [])
    assert answer.node_name == "n1"
    assert table_states(agent) == {
        ("g", "a"): "SAVED",
        ("g", "b"): "SAVED",
        ("g", "c"): "RUNNING",
        ("h", "x"): "RUNNING",
        ("", "free"): "SAVED",
        ("", "stray"): "RUNNING",
        ("g", "fresh"): "SAVED",
    }
    assert agent.table.tokens == {"g": 5}

    # The same request again finds everything done: nothing moves, and the next
    # job's context is still the one restored with this token.
    before = agent.table.to_dict()
    again = await client.switch_group("g", "c", 5, jobs=named, timeout_sec=SWITCH_TIMEOUT)
    assert [(s.job_id, s.operation_id) for s in again.steps] == [("bad", "")]
    assert (again.restored, again.next_state, again.faulted) == (True, JobState.RUNNING, [])
    assert agent.table.to_dict() == before

    # An older grant's switch is refused (ABORTED), and changes nothing.
    with pytest.raises(LeaseLostError, match="stale fencing token 4"):
        await client.switch_group("g", "a", 4, jobs=named, timeout_sec=SWITCH_TIMEOUT)
    assert agent.table.to_dict() == before

    # A newer one works.
    newer = await client.switch_group("g", "a", 6, jobs=named[:4], timeout_sec=SWITCH_TIMEOUT)
    assert {k: s.status for k, s in steps_of(newer).items()} == {
        ("c", "snapshot"): COMPLETE,
        ("a", "restore"): COMPLETE,
    }
    assert (newer.restored, newer.next_state) == (True, JobState.RUNNING)
    assert {k: v for k, v in table_states(agent).items() if v == "RUNNING"} == {
        ("g", "a"): "RUNNING",
        ("h", "x"): "RUNNING",
        ("", "stray"): "RUNNING",
    }
    assert agent.table.tokens == {"g": 6}


@pytest.mark.parametrize("http2", ["h2core", "grpclib"])
async def test_the_clients_unary_calls_take_the_http2_client_it_names(
    agent: Agent, http2: str
) -> None:
    """h2core's client by default, on a connection of its own: grpclib's channel is
    never dialled for unary calls; grpclib's when asked. Both answer the same."""
    async with AsyncSnapshotAgentClient(agent.address, http2=http2) as client:
        await running_noop(client, "a", "hg")
        answer = await client.switch_group(
            "hg", "a", 1, jobs=[pb.SwitchJob(job_id="a", backend_config=NOOP)], timeout_sec=10
        )
        assert answer.restored is False and answer.table_version > 0
        assert {j.job_id for j in (await client.status()).job_statuses} == {"a"}
        with pytest.raises(ConflictError, match="not FAULTED"):  # a status, mapped alike
            await client.reset_job("a", "hg")
        stubs = client._stubs
        assert stubs is not None
        dialled = getattr(stubs.channel, "_protocol", None) is not None
        if http2 == "h2core":
            assert stubs.unary is not None and stubs.unary._link is not None
            assert not dialled
        else:
            assert stubs.unary is None and dialled


def test_an_unknown_http2_client_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="http2 must be one of"):
        AsyncSnapshotAgentClient("127.0.0.1:1", http2="h3")


async def test_restored_says_whether_this_switch_brought_the_context_back(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    await running_noop(client, "x", "h")  # restored once, with no token
    await running_noop(client, "y", "h")

    # Live already, but not through a restore of this grant's: not restored.
    live = await client.switch_group("h", "x", 1, timeout_sec=SWITCH_TIMEOUT)
    assert [(s.job_id, s.kind, s.status) for s in live.steps] == [("y", "snapshot", COMPLETE)]
    assert (live.restored, live.next_state) == (False, JobState.RUNNING)

    # Never seen here: nothing to restore, and no state to tell.
    unknown = await client.switch_group("h", "ghost", 2, timeout_sec=SWITCH_TIMEOUT)
    assert [(s.job_id, s.kind) for s in unknown.steps] == [("x", "snapshot")]
    assert (unknown.restored, unknown.next_state) == (False, JobState.UNSPECIFIED)
    assert "ghost" not in {job for _, job in agent.table.jobs}

    # A restore by this token, then the next grant's switch to the same job: the
    # context was live already, so that grant says not restored.
    back = await client.switch_group("h", "y", 3, timeout_sec=SWITCH_TIMEOUT)
    assert (back.restored, [(s.job_id, s.kind) for s in back.steps]) == (True, [("y", "restore")])
    same = await client.switch_group("h", "y", 4, timeout_sec=SWITCH_TIMEOUT)
    assert (same.steps, same.restored, same.next_state) == ([], False, JobState.RUNNING)

    # No next job: the group's contexts all go out.
    empty = await client.switch_group("h", "", 5, timeout_sec=SWITCH_TIMEOUT)
    assert [(s.job_id, s.kind) for s in empty.steps] == [("y", "snapshot")]
    assert (empty.restored, empty.next_state) == (False, JobState.UNSPECIFIED)
    assert table_states(agent) == {("h", "x"): "SAVED", ("h", "y"): "SAVED"}


async def test_jobs_faulted_by_an_agent_restart_are_listed_and_left_alone(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    async with Agent(node_name="n1", db=db, backends=("noop",)) as agent:
        async with AsyncSnapshotAgentClient(agent.address) as client:
            await running_noop(client, "a", "g")
            await running_noop(client, "x", "h")
    # The noop backend forgets where its contexts are when the agent restarts.
    async with Agent(node_name="n1", db=db, backends=("noop",)) as agent:
        await until(
            lambda: all(j.state.value == "FAULTED" for j in agent.table.jobs.values()),
            "every job faulted after the restart",
        )
        async with AsyncSnapshotAgentClient(agent.address) as client:
            answer = await client.switch_group("g", "a", 1, timeout_sec=SWITCH_TIMEOUT)
        assert (answer.steps, answer.restored, answer.next_state) == (
            [], False, JobState.FAULTED,
        )  # fmt: skip
        assert [(j.job_id, j.group, j.state) for j in answer.faulted] == [
            ("a", "g", JobState.FAULTED)
        ]
        assert "cannot tell" in answer.faulted[0].fault
        agent.table.validate()


# --- SwitchGroup with host-memory workloads --------------------------------------------


async def test_host_memory_workloads_switch_back_and_forth_byte_exact(
    agent: Agent, stub: Stub, client: AsyncSnapshotAgentClient, tmp_path: Path
) -> None:
    memory_a, expected_a = filled(tmp_path / "store-a", 1)
    memory_b, expected_b = filled(tmp_path / "store-b", 2)
    with memory_a, memory_b:
        await _switch_back_and_forth(
            agent, stub, client, (memory_a, expected_a), (memory_b, expected_b)
        )


Filled = tuple[HostMemoryWorkload, dict[str, npt.NDArray[Any]]]


async def _switch_back_and_forth(
    agent: Agent, stub: Stub, client: AsyncSnapshotAgentClient, a: Filled, b: Filled
) -> None:
    size = 4 * MiB
    (memory_a, expected_a), (memory_b, expected_b) = a, b
    async with (
        registered(agent, "a", workload=memory_a),
        registered(agent, "b", workload=memory_b),
    ):
        live = {j.job_id: j.liveness for j in (await stub.status()).job_statuses}
        assert live == {"a": Liveness.ALIVE, "b": Liveness.ALIVE}

        first = await client.switch_group("g", "a", 1, timeout_sec=SWITCH_TIMEOUT)
        (out,) = first.steps
        assert (out.job_id, out.kind, out.status, out.storage_bytes) == (
            "b", "snapshot", COMPLETE, size,
        )  # fmt: skip
        assert out.device_bytes == size
        assert (first.restored, first.next_state) == (False, JobState.RUNNING)
        assert memory_b.state == "SAVED"
        with pytest.raises(ArraySavedError):
            memory_b["weights"]
        assert intact(memory_a, expected_a)

        to_b = await client.switch_group("g", "b", 2, timeout_sec=SWITCH_TIMEOUT)
        assert {k: (s.status, s.storage_bytes) for k, s in steps_of(to_b).items()} == {
            ("a", "snapshot"): (COMPLETE, size),
            ("b", "restore"): (COMPLETE, size),
        }
        assert (to_b.restored, to_b.next_state, to_b.faulted) == (True, JobState.RUNNING, [])
        assert (memory_a.state, memory_b.state) == ("SAVED", "RUNNING")
        assert intact(memory_b, expected_b)

        to_a = await client.switch_group("g", "a", 3, timeout_sec=SWITCH_TIMEOUT)
        assert set(steps_of(to_a)) == {("b", "snapshot"), ("a", "restore")}
        assert all(s.status == COMPLETE for s in to_a.steps)
        assert (to_a.restored, to_a.next_state) == (True, JobState.RUNNING)
        assert (memory_a.state, memory_b.state) == ("RUNNING", "SAVED")
        assert intact(memory_a, expected_a)
        assert await _states(stub) == {"a": JobState.RUNNING, "b": JobState.SAVED}

        # b's bytes are still whole when it comes back on its own.
        await client.restore_and_wait("b", "g", timeout_sec=10)
        assert intact(memory_b, expected_b)


async def test_a_snapshot_that_fails_faults_its_job_and_the_switch_goes_on(
    agent: Agent, stub: Stub, client: AsyncSnapshotAgentClient, tmp_path: Path
) -> None:
    def refuse(mode: str, tags: list[str]) -> None:
        raise RuntimeError("no room in host memory")

    def restore(tags: list[str]) -> None:
        return None

    memory, expected = filled(tmp_path / "store", 3)
    with memory:
        async with (
            registered(agent, "stuck", on_snapshot=refuse, on_restore=restore),
            registered(agent, "next", workload=memory),
        ):
            saved = await client.snapshot_and_wait(
                "next", "g", backend_config=app_channel_config(), timeout_sec=10
            )
            assert saved.status == "OPERATION_STATUS_COMPLETE"

            answer = await client.switch_group("g", "next", 7, timeout_sec=SWITCH_TIMEOUT)

            steps = steps_of(answer)
            assert set(steps) == {("stuck", "snapshot"), ("next", "restore")}
            failed = steps[("stuck", "snapshot")]
            assert failed.status == FAILED and failed.operation_id
            assert "no room in host memory" in (failed.error or "")
            assert steps[("next", "restore")].status == COMPLETE
            assert (answer.restored, answer.next_state) == (True, JobState.RUNNING)
            (faulted,) = answer.faulted
            assert (faulted.job_id, faulted.group, faulted.state) == (
                "stuck",
                "g",
                JobState.FAULTED,
            )
            assert "no room in host memory" in faulted.fault
            assert faulted.liveness == Liveness.ALIVE  # its workload is still there
            assert intact(memory, expected)

            # Again: the faulted job is not tried again; it is still listed.
            again = await client.switch_group("g", "next", 7, timeout_sec=SWITCH_TIMEOUT)
            assert (again.steps, again.restored) == ([], True)
            assert [j.job_id for j in again.faulted] == ["stuck"]
            assert await _states(stub) == {"stuck": JobState.FAULTED, "next": JobState.RUNNING}


async def _states(stub: Stub) -> dict[str, pb.JobState]:
    return {job: status.state for job, status in (await jobs(stub)).items()}


# --- a switch and the operations already under way --------------------------------------


async def test_a_switch_waits_for_an_operation_in_flight_and_switches_run_one_at_a_time(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    arrived, release = asyncio.Event(), asyncio.Event()

    async def slow_snapshot(mode: str, tags: list[str]) -> None:
        arrived.set()
        await release.wait()

    async def restore(tags: list[str]) -> None:
        return None

    async with (
        registered(agent, "slow", on_snapshot=slow_snapshot, on_restore=restore),
        registered(agent, "other", **noop_callbacks()),
    ):
        own = await client.snapshot("slow", "g", backend_config=app_channel_config())
        await asyncio.wait_for(arrived.wait(), 5)
        first = asyncio.create_task(client.switch_group("g", "slow", 2, timeout_sec=SWITCH_TIMEOUT))
        await until(lambda: agent.switch_lock("g").locked(), "the first switch runs")
        # Behind the first in the group's queue of switches, and older.
        second = asyncio.create_task(
            client.switch_group("g", "other", 1, timeout_sec=SWITCH_TIMEOUT)
        )
        await asyncio.sleep(0.3)
        assert not first.done() and not second.done()
        # Nothing was moved while the snapshot ran.
        assert table_states(agent) == {("g", "slow"): "TRANSITIONING", ("g", "other"): "RUNNING"}
        assert set(agent.table.operations) == {own.operation_id}

        release.set()
        answer = await asyncio.wait_for(first, 5)
        # It found the snapshot finished, so it restored the job.
        assert {k: s.status for k, s in steps_of(answer).items()} == {
            ("other", "snapshot"): COMPLETE,
            ("slow", "restore"): COMPLETE,
        }
        assert (answer.restored, answer.next_state) == (True, JobState.RUNNING)
        assert {agent.table.operations[st.operation_id].token for st in answer.steps} == {2}
        done = await client.get_operation(own.operation_id)
        assert done.status == "OPERATION_STATUS_COMPLETE"
        # The older switch ran only after it, and found a newer token.
        with pytest.raises(LeaseLostError):
            await asyncio.wait_for(second, 5)
        assert table_states(agent) == {("g", "slow"): "RUNNING", ("g", "other"): "SAVED"}


async def test_a_switch_right_after_a_callers_noop_snapshot_restores_the_job(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    await running_noop(client, "a", "g")
    await running_noop(client, "b", "g")
    started = await client.snapshot("a", "g")
    answer = await client.switch_group("g", "a", 1, timeout_sec=SWITCH_TIMEOUT)
    # The caller's snapshot of a is done by the time the switch looks (waited for, if
    # it was not): the switch restores a, and moves b out.
    assert {k: s.status for k, s in steps_of(answer).items()} == {
        ("b", "snapshot"): COMPLETE,
        ("a", "restore"): COMPLETE,
    }
    assert (answer.restored, answer.next_state) == (True, JobState.RUNNING)
    assert agent.table.operations[started.operation_id].status.value == "COMPLETE"


# --- liveness ---------------------------------------------------------------------------


class Connected:
    """A workload registered over a connection of its own (see `connected`)."""

    def __init__(self, channel: grpclib.client.Channel) -> None:
        self.channel = channel
        self.dropped = False

    def drop(self) -> None:
        """Close the connection without a word, as when the workload's process dies."""
        self.dropped = True
        self.channel.close()


@asynccontextmanager
async def connected(
    agent: Agent, job: str, group: str = "g", *, settle: bool = True
) -> AsyncIterator[Connected]:
    """Register `job` over a WorkloadChannel on a connection of its own; yield once
    the agent lists it and (with `settle`) has saved its registration: a workload
    that has been up for a while. It deregisters on exit unless dropped."""
    host, port = split_address(agent.address)
    channel = grpclib.client.Channel(host, port)
    workload = Connected(channel)
    try:
        async with channel.request(
            WORKLOAD_CHANNEL, Cardinality.STREAM_STREAM, pb.WorkloadMessage, pb.AgentCommand
        ) as stream:
            register = pb.RegisterWorkload(job_id=job, group=group)
            await stream.send_message(pb.WorkloadMessage(register=register))
            await until(lambda: agent.channels.get(group, job) is not None, f"{job} registered")
            if settle:  # no save of the job table under way, so the registration's is done
                await until(lambda: agent.engine.saved, f"{job}'s registration saved")
            yield workload
            if not workload.dropped:
                await stream.end()
                assert await asyncio.wait_for(stream.recv_message(), 5) is None
    except STREAM_ENDED:
        if not workload.dropped:
            raise
    finally:
        channel.close()


async def test_status_says_whether_each_jobs_workload_is_alive(agent: Agent, stub: Stub) -> None:
    await run_operation(stub, snapshot("quiet", "g", NOOP))
    async with connected(agent, "leaving"):
        async with connected(agent, "w") as job:
            found = await jobs(stub)
            assert found["w"].liveness == Liveness.ALIVE
            assert found["leaving"].liveness == Liveness.ALIVE
            assert found["quiet"].liveness == Liveness.UNSPECIFIED  # nothing to watch
            job.drop()
            gone = await wait_for_job(stub, "w", lambda j: j.liveness == Liveness.GONE)
            assert gone.state == JobState.FAULTED and gone.fault
    # A workload that says goodbye is forgotten, not reported gone.
    await wait_until_forgotten(stub, "leaving")
    assert (await jobs(stub))["w"].liveness == Liveness.GONE


async def test_a_workload_lost_while_its_registration_is_saved_is_reported_gone(
    agent: Agent, stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    apply = agent.engine.apply

    def slowly_saved(event: st.Event) -> asyncio.Future[None]:
        """`event` applied, its save told to its caller 0.3 s late."""
        saved = apply(event)

        async def late() -> None:
            await asyncio.sleep(0.3)
            await saved

        return asyncio.ensure_future(late())

    monkeypatch.setattr(agent.engine, "apply", slowly_saved)
    # Registered in the table (and listed), its registration still being saved.
    async with connected(agent, "w", settle=False) as job:
        job.drop()
    gone = await wait_for_job(stub, "w", lambda j: j.liveness == Liveness.GONE, timeout=3)
    assert gone.state == JobState.FAULTED
    assert agent.channels.get("g", "w") is None


@pytest.fixture
async def process() -> AsyncIterator[asyncio.subprocess.Process]:
    """A live process, standing for a job's CUDA process."""
    running = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        yield running
    finally:
        if running.returncode is None:
            running.kill()
            await running.wait()


def fake_cuda(agent: Agent, *pids: int) -> FakeCuda:
    """The agent's cuda backend, on a fake driver that knows `pids`."""
    cuda = FakeCuda()
    for pid in pids:
        cuda.add_process(pid, device_bytes=MiB)
    context = BackendContext(agent.config.node_name, agent.channels)
    agent.backends["cuda"] = CudaBackend(context, cuda.module(), FakeNvml(cuda).module())
    return cuda


def cuda_config(pid: int) -> pb.BackendConfig:
    return pb.BackendConfig(cuda=pb.CudaBackendConfig(pb.ProcessTarget(pids=[pid])))


async def test_a_job_claiming_a_process_is_alive_while_it_runs(
    agent: Agent, stub: Stub, process: asyncio.subprocess.Process
) -> None:
    fake_cuda(agent, process.pid)
    op_id = (await stub.snapshot(snapshot("p", "g", cuda_config(process.pid)))).operation_id
    await wait_for_job(stub, "p", lambda j: j.state == JobState.SAVED)
    assert agent.table.operations[op_id].status.value == "COMPLETE"
    assert (await jobs(stub))["p"].liveness == Liveness.ALIVE
    process.kill()
    await process.wait()
    assert (await jobs(stub))["p"].liveness == Liveness.GONE


# --- the agent's session with the orchestrator -------------------------------------------


async def first_notice(
    watch: AsyncIterator[Notice], want: Callable[[Any], bool], timeout: float = 5.0
) -> Any:
    """The first effect `watch` reports that `want` accepts, within `timeout` seconds."""

    async def scan() -> Any:
        async for notice in watch:
            if want(notice.effect):
                return notice.effect
        raise AssertionError("the watch ended")

    return await asyncio.wait_for(scan(), timeout)


async def test_an_agent_registers_with_its_orchestrator_and_reconnects_after_a_restart(
    tmp_path: Path, free_port: int
) -> None:
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    async with AsyncExitStack() as stack:
        orch = await stack.enter_async_context(Orchestrator(port=free_port, db=journal))
        agent = await stack.enter_async_context(
            Agent(
                node_name="n1",
                backends=("noop", "app_channel"),
                orchestrator=orch.address,
                groups=("g",),
            )
        )
        await until(
            lambda: orch.table.agents.get("n1") == agent.address
            and "n1" in orch.table.nodes.get("g", ())
            and orch.agents.addresses.get("n1") == agent.address,
            "the agent registered and joined g",
            timeout=1.0,
        )
        # Its session stays open: the orchestrator keeps hearing from it.
        for _ in range(30):
            assert orch.agents.addresses == {"n1": agent.address}
            await asyncio.sleep(0.01)

        # A change of the job table is reported at once.
        async with connected(agent, "w") as job:
            await until(lambda: orch.agents.liveness("n1", "g", "w") == "ALIVE", "w reported")
            job.drop()
            await until(lambda: orch.agents.liveness("n1", "g", "w") == "GONE", "w gone")

        await orch.close()
        assert orch.agents.addresses == {}
        restarted = await stack.enter_async_context(Orchestrator(port=free_port, db=journal))
        # The journal remembers the agent; its session comes back by itself.
        assert restarted.table.agents == {"n1": agent.address}
        assert restarted.table.nodes["g"] == ("n1",)
        await until(
            lambda: restarted.agents.addresses.get("n1") == agent.address,
            "the agent reconnected",
            timeout=5.0,
        )
        assert restarted.agents.liveness("n1", "g", "w") == "GONE"
        for _ in range(30):
            assert restarted.agents.addresses == {"n1": agent.address}
            await asyncio.sleep(0.01)


async def test_a_holder_whose_workload_channel_drops_is_revoked_for_the_next_waiter(
    tmp_path: Path,
) -> None:
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    async with (
        Orchestrator(db=journal, switch_timeout=10) as orch,
        Agent(
            node_name="n1",
            backends=("noop", "app_channel"),
            orchestrator=orch.address,
            groups=("g",),
        ) as agent,
    ):
        await until(lambda: "n1" in orch.table.nodes.get("g", ()), "the agent joined g")
        async with connected(agent, "a") as job:
            await until(lambda: orch.agents.liveness("n1", "g", "a") == "ALIVE", "a reported")
            watch = orch.watch("g")
            try:
                grant = await asyncio.wait_for(orch.acquire("g", "a"), 10)
                assert grant.job == "a"
                waiter = asyncio.create_task(orch.acquire("g", "b"))
                await until(lambda: "b" in orch.table.groups["g"].queue, "b waits")
                assert orch.table.groups["g"].holder is not None
                assert orch.table.groups["g"].holder.job == "a"

                job.drop()
                revoked = await first_notice(watch, lambda e: isinstance(e, ev.Revoked))
                assert (revoked.job, revoked.reason) == ("a", ev.Reason.HOLDER_GONE)
                granted = await asyncio.wait_for(waiter, 10)
                assert (granted.job, granted.context_restored) == ("b", False)
                holder = orch.table.groups["g"].holder
                assert holder is not None and holder.job == "b"
            finally:
                watch.close()
        # The agent still has a, faulted, its workload gone.
        assert agent.table.jobs[("g", "a")].state.value == "FAULTED"
        assert agent.liveness(agent.table.jobs[("g", "a")]) == "GONE"


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds on this platform")
async def test_a_holder_whose_process_exits_is_revoked_for_the_next_waiter(
    tmp_path: Path, process: asyncio.subprocess.Process
) -> None:
    async with (
        Orchestrator(switch_timeout=10) as orch,
        Agent(
            node_name="n1", backends=("noop",), orchestrator=orch.address, groups=("g",)
        ) as agent,
        agent_stubs(agent.address) as stubs,
    ):
        cuda = fake_cuda(agent, process.pid)
        request = snapshot("p", "g", cuda_config(process.pid))
        await stubs.agent.snapshot(request)
        await wait_for_job(stubs.agent, "p", lambda j: j.state == JobState.SAVED)
        await until(lambda: orch.agents.liveness("n1", "g", "p") == "ALIVE", "p reported")

        watch = orch.watch("g")
        try:
            grant = await asyncio.wait_for(orch.acquire("g", "p"), 10)
            # The switch before the grant brought p's context back.
            assert (grant.job, grant.context_restored) == ("p", True)
            assert cuda.state_of(process.pid).name == "CU_PROCESS_STATE_RUNNING"
            waiter = asyncio.create_task(orch.acquire("g", "q"))
            await until(lambda: "q" in orch.table.groups["g"].queue, "q waits")

            process.kill()  # nothing else changes: the exit alone must be reported
            await process.wait()
            revoked = await first_notice(watch, lambda e: isinstance(e, ev.Revoked))
            assert (revoked.job, revoked.reason) == ("p", ev.Reason.HOLDER_GONE)
            granted = await asyncio.wait_for(waiter, 10)
            assert granted.job == "q"
        finally:
            watch.close()


async def test_a_workload_not_back_yet_after_an_agent_restart_is_not_reported_gone(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'restart.db'}"
    async with Agent(node_name="n1", db=db, backends=("app_channel",)) as first:
        async with connected(first, "w") as job:
            job.drop()  # the agent goes down with the workload's channel open, as a crash
    async with Agent(node_name="n1", db=db, backends=("app_channel",)) as second:
        async with agent_stubs(second.address) as stubs:
            # Known from the saved table, its workload not reconnected yet: nothing
            # is known of it, which must not read as "gone" (a holder would be revoked).
            assert (await jobs(stubs.agent))["w"].liveness == Liveness.UNSPECIFIED
            async with connected(second, "w") as job:
                assert (await jobs(stubs.agent))["w"].liveness == Liveness.ALIVE
                job.drop()
                await wait_for_job(stubs.agent, "w", lambda j: j.liveness == Liveness.GONE)
