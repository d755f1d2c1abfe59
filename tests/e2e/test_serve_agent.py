"""`timeslice serve agent` as a process: killed with SIGKILL in the middle of a
snapshot, restarted on the same job table, and stopped with SIGTERM.

Workloads live in the test process: some registered with `register_workload`
(which reconnects by itself and says where its context is), one played message
by message over the raw WorkloadChannel stream.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from grpclib.exceptions import GRPCError

from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client.workload import WorkloadRegistration, register_workload

# The helpers shared with the integration tests, which import their own neighbours.
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from agent_wire import (  # noqa: E402
    APP_CHANNEL,
    NOOP,
    AgentStubs,
    JobState,
    OpStatus,
    agent_stubs,
    finish_operation,
    health_status,
    jobs,
    restore,
    run_operation,
    snapshot,
    states,
    workload,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TIMESLICE = [sys.executable, "-m", "timeslice"]
SLOW_SNAPSHOT_SEC = 2.0


class AgentProcess:
    """One `timeslice serve agent` process; its log goes to a file."""

    def __init__(self, port: int, db: str, log: Path, *options: str) -> None:
        self.port, self.log = port, log
        self.address = f"127.0.0.1:{port}"
        command = [*TIMESLICE, "serve", "agent", "--port", str(port), "--node-name", "node-1",
                   "--db", db, "--backend", "noop", "--backend", "app_channel", *options]  # fmt: skip
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent
            )

    async def ready(self, timeout: float = 30.0) -> None:
        """Wait until its health check answers SERVING."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"the agent exited:\n{self.log.read_text()}"
            async with agent_stubs(self.address, timeout=1) as stubs:
                try:
                    if (
                        await health_status(stubs)
                        == health.HealthCheckResponseServingStatus.SERVING
                    ):
                        return
                except (OSError, GRPCError, TimeoutError):
                    pass
            assert time.monotonic() < deadline, f"the agent never answered:\n{self.log.read_text()}"
            await asyncio.sleep(0.1)

    def stop(self, sig: signal.Signals, timeout: float) -> int:
        self.process.send_signal(sig)
        return self.process.wait(timeout)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agent.db'}"


@pytest.fixture
def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[AgentProcess]]]:
    """Start agents; each is killed at the end of the test if still running."""
    started: list[AgentProcess] = []

    async def start(port: int, db: str, *options: str) -> AgentProcess:
        agent = AgentProcess(port, db, tmp_path / "agent.log", *options)
        started.append(agent)
        await agent.ready()
        return agent

    yield start
    for agent in started:
        if agent.process.poll() is None:
            agent.process.kill()
        agent.process.wait(10)


class CallbackWorkload:
    """What a workload's callbacks were asked to do; its snapshot can be made slow."""

    def __init__(self, snapshot_sec: float = 0.0) -> None:
        self.snapshot_sec = snapshot_sec
        self.snapshots = 0
        self.restores = 0
        self.snapshot_started = asyncio.Event()

    async def on_snapshot(self, mode: str, tags: list[str]) -> tuple[int, int]:
        self.snapshot_started.set()
        await asyncio.sleep(self.snapshot_sec)
        self.snapshots += 1
        return 1000, 2000

    async def on_restore(self, tags: list[str]) -> tuple[int, int]:
        self.restores += 1
        return 1000, 2000


@asynccontextmanager
async def registered(
    address: str, job: str, workload: CallbackWorkload
) -> AsyncIterator[WorkloadRegistration]:
    registration = await register_workload(
        address, job, "g", on_snapshot=workload.on_snapshot, on_restore=workload.on_restore,
        connect_timeout_sec=10,
    )  # fmt: skip
    try:
        yield registration
    finally:
        await registration.close()


async def watch_states(stub: pb.SnapshotAgentServiceStub, job: str, until: JobState,
                       timeout: float = 20.0) -> list[JobState]:  # fmt: skip
    """Every state Status reports for `job` until it is `until`, in order, without repeats."""
    seen: list[JobState] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1] != until:
        state = (await jobs(stub))[job].state
        if not seen or seen[-1] != state:
            seen.append(state)
        assert time.monotonic() < deadline, f"{job} went through {seen}, never {until.name}"
        await asyncio.sleep(0.02)
    return seen


async def test_sigkill_during_a_snapshot_then_restart_keeps_the_job_table(
    serve: Callable[..., Awaitable[AgentProcess]], db: str, free_port: int
) -> None:
    server = await serve(free_port, db)
    address = server.address
    slow, steady = CallbackWorkload(SLOW_SNAPSHOT_SEC), CallbackWorkload()
    async with AsyncExitStack() as stack:
        stubs: AgentStubs = await stack.enter_async_context(agent_stubs(address))
        stub = stubs.agent
        await stack.enter_async_context(registered(address, "saved", steady))
        await stack.enter_async_context(registered(address, "slow", slow))
        stuck = await stack.enter_async_context(workload(address, "stuck", "g"))

        saved_op = (await stub.snapshot(snapshot("saved", "g", APP_CHANNEL))).operation_id
        assert (await finish_operation(stub, saved_op)).status == OpStatus.COMPLETE
        assert (await run_operation(stub, snapshot("noop", "g", NOOP))).status == OpStatus.COMPLETE
        slow_op = (await stub.snapshot(snapshot("slow", "g", APP_CHANNEL))).operation_id
        stuck_op = (await stub.snapshot(snapshot("stuck", "g", APP_CHANNEL))).operation_id
        await stuck.command()
        await asyncio.wait_for(slow.snapshot_started.wait(), 5)
        assert await states(stub) == {
            "saved": JobState.SAVED, "noop": JobState.SAVED,
            "slow": JobState.TRANSITIONING, "stuck": JobState.TRANSITIONING,
        }  # fmt: skip

        assert server.stop(signal.SIGKILL, 10) == -signal.SIGKILL
        server = await serve(free_port, db)

        # The table is back; nothing is reported RUNNING, since nothing is known to be.
        after = await jobs(stub)
        assert set(after) == {"saved", "noop", "slow", "stuck"}
        assert all(j.state != JobState.RUNNING for j in after.values()), after
        assert all(j.group == "g" for j in after.values())
        interrupted = after["stuck"]
        assert interrupted.state == JobState.FAULTED
        assert stuck_op in interrupted.fault and "interrupted" in interrupted.fault
        assert after["noop"].state == JobState.FAULTED  # noop cannot tell after a restart
        for op_id in (slow_op, stuck_op):
            answer = await stub.get_operation(pb.GetOperationRequest(operation_id=op_id))
            assert answer.status == OpStatus.FAILED, answer
            assert "interrupted" in (answer.error or "")
        finished = await stub.get_operation(pb.GetOperationRequest(operation_id=saved_op))
        assert (finished.status, finished.job_id, finished.storage_bytes) == (
            OpStatus.COMPLETE, "saved", 1000,
        )  # fmt: skip

        # The registered workloads come back by themselves, saying where they are:
        # the saved one SAVED, and the slow one SAVED too, its snapshot having ended.
        assert JobState.RUNNING not in await watch_states(stub, "saved", JobState.SAVED)
        assert JobState.RUNNING not in await watch_states(stub, "slow", JobState.SAVED)
        assert slow.snapshots == 1
        # The raw workload comes back saying it never moved.
        await stuck.ended()
        async with workload(address, "stuck", "g", state=JobState.RUNNING) as again:
            assert (await jobs(stub))["stuck"].fault == ""

            back = await run_operation(stub, restore("saved", "g"))
            assert back.status == OpStatus.COMPLETE
            assert back.kind == "restore"
            assert steady.restores == 1
            op_id = (await stub.snapshot(snapshot("stuck", "g"))).operation_id
            assert op_id not in (saved_op, slow_op, stuck_op)
            await again.answer(await again.command())
            assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE
            assert (await stub.reset_job(pb.ResetJobRequest(job_id="noop", group="g"))).state == (
                JobState.FAULTED
            )
            assert await states(stub) == {
                "saved": JobState.RUNNING, "noop": JobState.FAULTED, "slow": JobState.SAVED,
                "stuck": JobState.SAVED,
            }  # fmt: skip

            stopping = time.monotonic()
            code = await asyncio.to_thread(server.stop, signal.SIGTERM, 10)
            assert code == 0, server.log.read_text()
            assert time.monotonic() - stopping < 5
            assert await again.ended() is None


async def test_sigterm_stops_cleanly_with_calls_and_workloads_open(
    serve: Callable[..., Awaitable[AgentProcess]], db: str, free_port: int
) -> None:
    server = await serve(free_port, db)
    saving = CallbackWorkload()
    async with agent_stubs(server.address) as stubs:
        stub = stubs.agent
        async with registered(server.address, "kept", saving) as registration:
            assert (await run_operation(stub, snapshot("kept", "g", APP_CHANNEL))).status == (
                OpStatus.COMPLETE
            )
            async with workload(server.address, "busy", "g") as busy:
                op_id = (await stub.snapshot(snapshot("busy", "g", APP_CHANNEL))).operation_id
                await busy.command()
                waiting = asyncio.ensure_future(
                    stub.get_operation(pb.GetOperationRequest(operation_id=op_id, wait_ms=30_000))
                )
                await asyncio.sleep(0.2)

                stopping = time.monotonic()
                code = await asyncio.to_thread(server.stop, signal.SIGTERM, 10)
                assert code == 0, server.log.read_text()
                assert time.monotonic() - stopping < 5
                assert "shutting down" in server.log.read_text()
                # Nothing was left hanging: the waiting call was answered or cut off,
                # and the workload's stream ended.
                outcome = (await asyncio.gather(asyncio.wait_for(waiting, 5),
                                                return_exceptions=True))[0]  # fmt: skip
                assert not isinstance(outcome, TimeoutError), outcome
                assert await busy.ended() is None

            server = await serve(free_port, db)
            assert JobState.RUNNING not in await watch_states(stub, "kept", JobState.SAVED)
            assert registration.connected
            gone = (await jobs(stub))["busy"]
            assert gone.state == JobState.FAULTED and gone.fault
            failed = await stub.get_operation(pb.GetOperationRequest(operation_id=op_id))
            assert failed.status == OpStatus.FAILED and failed.error
            assert (await run_operation(stub, restore("kept", "g"))).status == OpStatus.COMPLETE
            assert saving.restores == 1
    assert server.stop(signal.SIGTERM, 10) == 0


async def test_an_unknown_backend_name_is_refused_at_startup(
    tmp_path: Path, free_port: int
) -> None:
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*TIMESLICE, "serve", "agent", "--port", str(free_port), "--db", "memory",
             "--backend", "noop", "--backend", "app_chanel"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while process.poll() is None:
            async with agent_stubs(f"127.0.0.1:{free_port}", timeout=1) as stubs:
                try:
                    serving = await health_status(stubs)
                except (OSError, GRPCError, TimeoutError):
                    serving = None
            assert serving != health.HealthCheckResponseServingStatus.SERVING, (
                f"the agent serves without backend app_chanel:\n{log.read_text()}"
            )
            assert time.monotonic() < deadline, "the agent neither served nor exited"
            await asyncio.sleep(0.1)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
    text = log.read_text()
    assert process.returncode != 0, text
    assert "app_chanel" in text and "app_channel" in text and "noop" in text, text
