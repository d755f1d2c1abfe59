"""The Agent over real gRPC on 127.0.0.1, driven with the generated stubs.

Each test starts an Agent with an SQLite job table in a temporary directory and
talks to it as any program would: through TCP, with deadlines. Workloads are
played by the test itself over the WorkloadChannel stream, one message at a
time, so that each step of the protocol can be seen.
"""

from __future__ import annotations

from contextlib import suppress

import asyncio
import os
import sqlite3
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_wire import (
    APP_CHANNEL,
    NOOP,
    AgentStubs,
    JobState,
    MiB,
    OpStatus,
    agent_stubs,
    app_channel,
    call_raw,
    everything,
    finish_operation,
    grpc_error,
    health_status,
    jobs,
    restore,
    run_operation,
    snapshot,
    states,
    wait_for_job,
    wait_until_forgotten,
    workload,
    workload_channel_raw,
)
from grpclib.exceptions import StreamTerminatedError
from grpclib.const import Status

from tests.fakes.fake_cuda import FakeCuda, FakeNvml
from tests.fakes.fake_inference_server import FakeInferenceServer
from tests.waiting import until
from timeslice import storage
from timeslice.agent.server import Agent
from timeslice.agent.store import StateStore
from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import BackendContext
from timeslice.backends.cuda import CudaBackend

pytestmark = pytest.mark.timeout(60)

Stub = pb.SnapshotAgentServiceStub
Serving = health.HealthCheckResponseServingStatus
BACKENDS = ("noop", "app_channel", "app_endpoint")


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with Agent(node_name="n1", db=f"sqlite:///{tmp_path / 'agent.db'}",
                     backends=BACKENDS) as running:  # fmt: skip
        yield running
        running.table.validate()


@pytest.fixture
async def stubs(agent: Agent) -> AsyncIterator[AgentStubs]:
    async with agent_stubs(agent.address) as s:
        yield s


@pytest.fixture
def stub(stubs: AgentStubs) -> Stub:
    return stubs.agent


# --- snapshot and restore ----------------------------------------------------------------


async def test_noop_job_is_snapshotted_and_restored_with_complete_operations(
    agent: Agent, stub: Stub
) -> None:
    started = await stub.snapshot(snapshot("j", "g", NOOP))
    done = await finish_operation(stub, started.operation_id)
    assert done.status == OpStatus.COMPLETE
    assert (done.job_id, done.group, done.kind, done.backend) == ("j", "g", "snapshot", "noop")
    assert (done.storage_bytes, done.snapshot_device_bytes, done.error) == (0, 0, None)
    assert 0 <= done.elapsed_ms < 5000
    status = await stub.status()
    assert status.node_name == "n1"
    assert [(j.job_id, j.group, j.state, j.backend, j.fault, j.operation_id)
            for j in status.job_statuses] == [
        ("j", "g", JobState.SAVED, "noop", "", started.operation_id)
    ]  # fmt: skip

    # The job is known now: a restore needs no backend config.
    back = await run_operation(stub, restore("j", "g"))
    assert (back.status, back.kind, back.backend) == (OpStatus.COMPLETE, "restore", "noop")
    assert await states(stub) == {"j": JobState.RUNNING}
    # A finished operation can still be looked up, unchanged.
    again = await stub.get_operation(pb.GetOperationRequest(operation_id=started.operation_id))
    assert again == done


async def test_get_operation_waits_server_side_until_the_operation_ends(
    agent: Agent, stub: Stub
) -> None:
    async with workload(agent.address, "w", "g") as job:
        op_id = (await stub.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
        command = await job.command()
        assert command.snapshot is not None

        asked = time.monotonic()
        pending = await stub.get_operation(pb.GetOperationRequest(operation_id=op_id, wait_ms=300))
        assert 0.25 <= time.monotonic() - asked < 3
        assert pending.status == OpStatus.PENDING
        assert (pending.storage_bytes, pending.snapshot_device_bytes, pending.error) == (
            None, None, None,
        )  # fmt: skip
        assert (await jobs(stub))["w"].state == JobState.TRANSITIONING

        waiting = asyncio.ensure_future(
            stub.get_operation(pb.GetOperationRequest(operation_id=op_id, wait_ms=20_000))
        )
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await job.answer(command, storage_bytes=123 * MiB, device_bytes=100 * MiB)
        answered = time.monotonic()
        done = await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - answered < 1
        assert done.status == OpStatus.COMPLETE
        assert (done.storage_bytes, done.snapshot_device_bytes) == (123 * MiB, 100 * MiB)
        assert done.elapsed_ms >= 400
        assert (await jobs(stub))["w"].state == JobState.SAVED


async def test_workload_commands_carry_a_resolved_mode_and_the_tags(
    agent: Agent, stub: Stub
) -> None:
    caps = pb.WorkloadCapabilities(default_mode=pb.SuspendMode.DISCARD, tags=["weights", "kv"])
    async with (
        workload(agent.address, "plain", "g") as plain,
        workload(agent.address, "discarding", "g", capabilities=caps) as discarding,
    ):
        cases = [
            (plain, pb.SuspendMode.UNSPECIFIED, pb.SuspendMode.OFFLOAD),
            (discarding, pb.SuspendMode.UNSPECIFIED, pb.SuspendMode.DISCARD),
            (discarding, pb.SuspendMode.OFFLOAD, pb.SuspendMode.OFFLOAD),
            (plain, pb.SuspendMode.DISCARD, pb.SuspendMode.DISCARD),
        ]
        ids: set[str] = set()
        for job, asked, sent in cases:
            op_id = (
                await stub.snapshot(snapshot(job.job, "g", app_channel(asked, "kv")))
            ).operation_id
            command = await job.command()
            assert command.snapshot is not None and command.restore is None
            assert (command.snapshot.mode, command.snapshot.tags) == (sent, ["kv"])
            assert command.deadline_ms > 0
            await job.answer(command)
            assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE

            restoring = app_channel(pb.SuspendMode.UNSPECIFIED, "weights")
            op_id = (await stub.restore(restore(job.job, "g", restoring))).operation_id
            back = await job.command()
            assert back.restore is not None and back.snapshot is None
            assert back.restore.tags == ["weights"]
            await job.answer(back)
            assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE
            ids |= {command.command_id, back.command_id}
        assert len(ids) == 2 * len(cases), "command ids repeat"
        assert await states(stub) == {"plain": JobState.RUNNING, "discarding": JobState.RUNNING}


async def test_a_mode_the_workload_does_not_support_is_refused_and_changes_nothing(
    agent: Agent, stub: Stub
) -> None:
    caps = pb.WorkloadCapabilities(supported_modes=[pb.SuspendMode.OFFLOAD])
    async with workload(agent.address, "w", "g", capabilities=caps) as job:
        before = await everything(stub)
        error = await grpc_error(
            stub.snapshot(snapshot("w", "g", app_channel(pb.SuspendMode.DISCARD)))
        )
        assert error.status == Status.INVALID_ARGUMENT, error
        assert "offload" in (error.message or "")
        assert await everything(stub) == before
        # The workload was not bothered, and a supported mode still works.
        op_id = (await stub.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
        command = await job.command()
        assert command.snapshot is not None and command.snapshot.mode == pb.SuspendMode.OFFLOAD
        await job.answer(command)
        assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE


async def test_fencing_tokens_only_grow_per_group(agent: Agent, stub: Stub) -> None:
    first = await run_operation(stub, snapshot("j", "g", NOOP, fencing_token=5))
    assert first.status == OpStatus.COMPLETE
    # The same token again is the same holder: accepted.
    assert (await run_operation(stub, restore("j", "g", fencing_token=5))).status == (
        OpStatus.COMPLETE
    )
    before = await everything(stub)
    error = await grpc_error(stub.snapshot(snapshot("j", "g", fencing_token=4)))
    assert error.status == Status.ABORTED
    assert "stale fencing token 4" in (error.message or "")
    assert await everything(stub) == before
    # Another group has tokens of its own; zero means "not checked".
    assert (await run_operation(stub, snapshot("k", "h", NOOP, fencing_token=1))).status == (
        OpStatus.COMPLETE
    )
    assert (await run_operation(stub, snapshot("j", "g"))).status == OpStatus.COMPLETE
    assert (await run_operation(stub, restore("j", "g", fencing_token=6))).status == (
        OpStatus.COMPLETE
    )
    assert (await grpc_error(stub.snapshot(snapshot("j", "g", fencing_token=5)))).status == (
        Status.ABORTED
    )


async def test_a_job_table_another_writer_holds_holds_up_only_the_calls_that_change_it(
    agent: Agent, stub: Stub, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "agent.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another writer: a sqlite3 shell, say
        started = asyncio.ensure_future(stub.snapshot(snapshot("j", "g", NOOP)))
        before = time.monotonic()
        await asyncio.sleep(0.2)
        assert time.monotonic() - before < 1  # the loop is not stuck in the save
        assert not started.done()  # a snapshot is answered once it is saved
        # What changes nothing is answered meanwhile.
        assert (await asyncio.wait_for(stub.status(), 2)).node_name == "n1"
        other.execute("ROLLBACK")
        op_id = (await asyncio.wait_for(started, 5)).operation_id
        assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE
    finally:
        other.close()
    saved = await saved_table(tmp_path / "agent.db")
    assert [(j["job"], j["state"]) for j in saved["jobs"]] == [("j", "SAVED")]
    assert await states(stub) == {"j": JobState.SAVED}  # and saves go on inline


async def test_a_job_table_held_past_the_busy_timeout_fails_the_calls_waiting_on_it(
    agent: Agent, stub: Stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "SQLITE_BUSY_TIMEOUT", 0.3)
    other = sqlite3.connect(tmp_path / "agent.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        error = await asyncio.wait_for(grpc_error(stub.snapshot(snapshot("j", "g", NOOP))), 5)
        assert error.status == Status.UNAVAILABLE
        assert "could not save its job table" in (error.message or "")
        assert "is locked by another writer" in (error.message or "")
    finally:
        other.close()
    # Once it is free, the next change is saved with everything before it.
    assert (await run_operation(stub, snapshot("k", "g", NOOP))).status == OpStatus.COMPLETE
    saved = await saved_table(tmp_path / "agent.db")
    assert {j["job"] for j in saved["jobs"]} >= {"k"}


async def test_an_agent_closed_while_its_job_table_is_held_saves_it_once_free(
    tmp_path: Path,
) -> None:
    path = tmp_path / "closing.db"
    agent = Agent(node_name="n1", db=f"sqlite:///{path}", backends=BACKENDS)
    await agent.start()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        async with agent_stubs(agent.address) as s:
            other.execute("BEGIN IMMEDIATE")
            started = asyncio.ensure_future(s.agent.snapshot(snapshot("j", "g", NOOP)))
            await asyncio.sleep(0.2)
            assert not started.done()
            closing = asyncio.ensure_future(agent.close())
            await asyncio.sleep(0.3)
            assert not closing.done()  # the last save waits for the file, off the loop
            other.execute("ROLLBACK")
            await asyncio.wait_for(closing, 10)
            started.cancel()
            await asyncio.gather(started, return_exceptions=True)
    finally:
        other.close()
        await agent.close()
    saved = await saved_table(path)
    assert [(j["group"], j["job"]) for j in saved["jobs"]] == [("g", "j")]


async def saved_table(path: Path) -> dict[str, Any]:
    """The job table as saved in the agent's file (read beside the running agent)."""
    store = StateStore(str(path))
    await store.open()
    try:
        saved = await store.load()
    finally:
        await store.close()
    assert saved is not None
    return saved


# --- workloads that fail, go away, or come back --------------------------------------------


async def test_a_faulted_job_is_quarantined_while_others_go_on_and_reset_brings_it_back(
    agent: Agent, stub: Stub
) -> None:
    await run_operation(stub, snapshot("other", "g", NOOP))
    async with workload(agent.address, "w", "g") as job:
        op_id = (await stub.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
        await job.answer(await job.command(), ok=False, error="pinned memory exhausted")
        failed = await finish_operation(stub, op_id)
        assert failed.status == OpStatus.FAILED
        assert "pinned memory exhausted" in (failed.error or "")
        assert failed.storage_bytes is None and failed.snapshot_device_bytes is None
        faulted = (await jobs(stub))["w"]
        assert faulted.state == JobState.FAULTED
        assert op_id in faulted.fault and "pinned memory exhausted" in faulted.fault

        # Quarantined: refused until reset, while the other job goes on.
        for call in (stub.snapshot(snapshot("w", "g")), stub.restore(restore("w", "g"))):
            error = await grpc_error(call)
            assert error.status == Status.FAILED_PRECONDITION
            assert "FAULTED" in (error.message or "")
        assert (await run_operation(stub, restore("other", "g"))).status == OpStatus.COMPLETE
        assert (await run_operation(stub, snapshot("other", "g"))).status == OpStatus.COMPLETE
        assert (await jobs(stub))["w"].state == JobState.FAULTED

        reset = await stub.reset_job(pb.ResetJobRequest(job_id="w", group="g"))
        assert reset.state == JobState.RUNNING
        after = (await jobs(stub))["w"]
        assert (after.state, after.fault) == (JobState.RUNNING, "")
        op_id = (await stub.snapshot(snapshot("w", "g"))).operation_id
        await job.answer(await job.command())
        assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE
        assert await states(stub) == {"other": JobState.SAVED, "w": JobState.SAVED}


async def test_an_operation_past_its_deadline_fails_and_faults_only_its_job(
    agent: Agent, stub: Stub
) -> None:
    async with workload(agent.address, "slow", "g") as job:
        op_id = (
            await stub.snapshot(snapshot("slow", "g", APP_CHANNEL, timeout_ms=300))
        ).operation_id
        command = await job.command()
        assert 0 < command.deadline_ms <= 300
        failed = await finish_operation(stub, op_id)
        assert failed.status == OpStatus.FAILED
        assert "deadline" in (failed.error or "") or "within" in (failed.error or "")
        assert 250 <= failed.elapsed_ms < 3000
        assert (await jobs(stub))["slow"].state == JobState.FAULTED

        # The workload's late answer does not revive the failed operation.
        channel = agent.channels.get("g", "slow")
        assert channel is not None
        await job.answer(command)
        await until(lambda: channel.state == "SAVED", "the late answer is heard")
        assert (await finish_operation(stub, op_id)).status == OpStatus.FAILED
        assert (await run_operation(stub, snapshot("noop-job", "g", NOOP))).status == (
            OpStatus.COMPLETE
        )


async def test_a_late_answer_does_not_cost_the_workload_its_channel(
    agent: Agent, stub: Stub
) -> None:
    async with workload(agent.address, "slow", "g") as job:
        op_id = (
            await stub.snapshot(snapshot("slow", "g", APP_CHANNEL, timeout_ms=200))
        ).operation_id
        command = await job.command()
        assert (await finish_operation(stub, op_id)).status == OpStatus.FAILED
        channel = agent.channels.get("g", "slow")
        assert channel is not None
        await job.answer(command)  # after the agent gave up on it
        await until(lambda: channel.state == "SAVED", "the late answer is heard")
        # The late answer said the snapshot was done after all: the context is saved.
        reset = await stub.reset_job(pb.ResetJobRequest(job_id="slow", group="g"))
        assert reset.state == JobState.SAVED
        op_id = (await stub.restore(restore("slow", "g"))).operation_id
        await job.answer(await job.command())
        assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE
        op_id = (await stub.snapshot(snapshot("slow", "g"))).operation_id
        await job.answer(await job.command())
        assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE


async def test_a_workload_that_goes_away_faults_its_job_until_it_registers_again(
    agent: Agent, stub: Stub
) -> None:
    await run_operation(stub, snapshot("other", "g", NOOP))
    async with workload(agent.address, "w", "g") as job:
        op_id = (await stub.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
        await job.command()
        await job.cut()  # the process died, say: its stream is reset, not ended
    failed = await finish_operation(stub, op_id)
    assert failed.status == OpStatus.FAILED
    assert failed.error
    gone = await wait_for_job(stub, "w", lambda j: j.state == JobState.FAULTED)
    assert gone.fault
    assert (await jobs(stub))["other"].state == JobState.SAVED

    async with workload(agent.address, "w", "g", state=JobState.SAVED) as job:
        back = (await jobs(stub))["w"]
        assert (back.state, back.fault) == (JobState.SAVED, "")
        op_id = (await stub.restore(restore("w", "g"))).operation_id
        command = await job.command()
        assert command.restore is not None
        await job.answer(command)
        assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE
        assert (await jobs(stub))["w"].state == JobState.RUNNING
        await job.cut()
    await wait_for_job(stub, "w", lambda j: j.state == JobState.FAULTED)


async def test_a_workload_that_ends_its_stream_deregisters_unless_an_operation_moves_it(
    agent: Agent, stub: Stub
) -> None:
    async with workload(agent.address, "leaving", "g"):
        pass  # the stream is ended cleanly: the workload says goodbye
    await wait_until_forgotten(stub, "leaving")

    async with workload(agent.address, "w", "g") as job:
        op_id = (await stub.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
        await job.command()
    # Gone in the middle of a snapshot: where its context is, nobody knows.
    failed = await finish_operation(stub, op_id)
    assert failed.status == OpStatus.FAILED
    assert "deregistered" in (failed.error or "")
    assert (await wait_for_job(stub, "w", lambda j: j.state == JobState.FAULTED)).fault
    assert await grpc_error(stub.snapshot(snapshot("w", "g"))) is not None


async def test_registering_again_replaces_the_older_stream(agent: Agent, stub: Stub) -> None:
    async with workload(agent.address, "w", "g") as old:
        async with workload(agent.address, "w", "g") as new:
            # The older stream is told that another channel took its place.
            ended = await old.ended()
            assert ended is not None and ended.status == Status.ALREADY_EXISTS, ended
            assert "took this one's place" in (ended.message or "")
            op_id = (await stub.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
            await new.answer(await new.command())
            assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE
            assert (await jobs(stub))["w"].state == JobState.SAVED


async def test_a_job_in_operation_cannot_be_registered_again(agent: Agent, stub: Stub) -> None:
    async with workload(agent.address, "w", "g") as job:
        op_id = (await stub.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
        command = await job.command()
        before = await everything(stub)
        register = pb.WorkloadMessage(register=pb.RegisterWorkload(job_id="w", group="g"))
        error = await grpc_error(workload_channel_raw(agent.address, [bytes(register)]))
        assert error.status == Status.FAILED_PRECONDITION
        assert await everything(stub) == before
        await job.answer(command)
        assert (await finish_operation(stub, op_id)).status == OpStatus.COMPLETE


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(
            pb.WorkloadMessage(register=pb.RegisterWorkload(job_id="w", group="g")),
            Status.INVALID_ARGUMENT,
            id="second-register",
        ),
        pytest.param(
            pb.WorkloadMessage(result=pb.CommandResult(command_id="cmd-1", error="e" * 4 * MiB)),
            Status.RESOURCE_EXHAUSTED,
            id="result-over-4MiB",
        ),
    ],
)
async def test_a_workload_that_breaks_the_protocol_is_told_why(
    agent: Agent, stub: Stub, message: pb.WorkloadMessage, expected: Status
) -> None:
    async with workload(agent.address, "w", "g") as job:
        # The agent refuses an oversized message after its header, without reading it
        # all: the send itself is then cut off.
        with suppress(StreamTerminatedError):
            await job.stream.send_message(message)
        error = await job.ended()
        assert error is not None and error.status == expected, error
        gone = await wait_for_job(stub, "w", lambda j: j.state == JobState.FAULTED)
        assert gone.fault


# --- bad input: a clear status, and nothing changes ----------------------------------------

LONG = "x" * 257
Call = Callable[[Stub, str], Awaitable[Any]]


def _unary(method: str, message: Any) -> Call:
    return lambda stub, _: getattr(stub, method)(message)


def _raw(method: str, payload: bytes) -> Call:
    return lambda _, address: call_raw(address, method, payload)


def _channel(*messages: pb.WorkloadMessage | bytes, end: bool = False) -> Call:
    payloads = [m if isinstance(m, bytes) else bytes(m) for m in messages]
    return lambda _, address: workload_channel_raw(address, payloads, end)


def _register(job: str, group: str = "g", **extensions: Any) -> pb.WorkloadMessage:
    return pb.WorkloadMessage(register=pb.RegisterWorkload(job_id=job, group=group, **extensions))


def _get(op_id: str, **extensions: Any) -> Call:
    return _unary("get_operation", pb.GetOperationRequest(operation_id=op_id, **extensions))


def _reset(job: str, group: str = "g") -> Call:
    return _unary("reset_job", pb.ResetJobRequest(job_id=job, group=group))


def _named(name: str, **options: str) -> pb.BackendConfig:
    return pb.BackendConfig(named=pb.NamedBackendConfig(name=name, options=options))


def _endpoint(app: pb.App, *urls: str) -> pb.BackendConfig:
    return pb.BackendConfig(app_endpoint=pb.AppEndpointConfig(app=app, endpoints=list(urls)))


PIDS = pb.ProcessTarget(pids=[2**31 - 1])
RESULT = pb.WorkloadMessage(result=pb.CommandResult(command_id="cmd-1", ok=True))

# Before each call: in group "g", noop job "saved" is SAVED (fencing token 5) and noop
# job "running" is RUNNING; workload "w" is RUNNING, and workload "busy" (group "b")
# is in snapshot operation op-4, unanswered. Job "ghost" is nobody.
BAD_INPUT: dict[Status, dict[str, Call]] = {
    Status.INVALID_ARGUMENT: {
        "snapshot-empty-job": _unary("snapshot", snapshot("", "g", NOOP)),
        "snapshot-long-job": _unary("snapshot", snapshot(LONG, "g", NOOP)),
        "snapshot-long-group": _unary("snapshot", snapshot("ghost", LONG, NOOP)),
        "snapshot-long-utf8-job": _unary("snapshot", snapshot("é" * 129, "g", NOOP)),
        "snapshot-control-character": _unary("snapshot", snapshot("ghost\n", "g", NOOP)),
        "snapshot-empty-job-app-channel": _unary("snapshot", snapshot("", "g", APP_CHANNEL)),
        "snapshot-long-group-app-channel": _unary("snapshot", snapshot("w", LONG, APP_CHANNEL)),
        "restore-empty-job": _unary("restore", restore("", "g")),
        "restore-long-job": _unary("restore", restore(LONG, "g")),
        "snapshot-zero-timeout": _unary("snapshot", snapshot("running", "g", timeout_ms=0)),
        "restore-negative-timeout": _unary("restore", restore("saved", "g", timeout_ms=-1)),
        "snapshot-unknown-backend": _unary("snapshot", snapshot("ghost", "g", _named("nope"))),
        "snapshot-unnamed-backend": _unary("snapshot", snapshot("ghost", "g", _named(""))),
        "snapshot-noop-with-options": _unary(
            "snapshot", snapshot("ghost", "g", _named("noop", speed="fast"))
        ),
        "snapshot-app-endpoint-without-app": _unary(
            "snapshot", snapshot("ghost", "g", _endpoint(pb.App.UNSPECIFIED, "http://127.0.0.1:1"))
        ),
        "snapshot-app-endpoint-without-endpoints": _unary(
            "snapshot", snapshot("ghost", "g", _endpoint(pb.App.VLLM))
        ),
        "snapshot-app-endpoint-not-http": _unary(
            "snapshot", snapshot("ghost", "g", _endpoint(pb.App.VLLM, "ftp://127.0.0.1:1"))
        ),
        "get-operation-empty-id": _get(""),
        "get-operation-negative-wait": _get("op-1", wait_ms=-1),
        "reset-empty-job": _reset(""),
        "reset-long-job": _reset(LONG),
        "reset-long-group": _reset("running", LONG),
        # job_id (field 1) says 5 bytes follow; only 2 do.
        "snapshot-truncated-field": _raw("Snapshot", b"\x0a\x05ab"),
        # job_id sent as a varint.
        "restore-wrong-wire-type": _raw("Restore", b"\x08\x01"),
        "snapshot-invalid-utf8": _raw("Snapshot", b"\x0a\x02\xff\xfe\x12\x01g"),
        "get-operation-wrong-wire-type": _raw("GetOperation", b"\x0d\x00\x00\x00\x00"),
        "status-truncated-field": _raw("Status", b"\x0a\x05ab"),
        "channel-result-first": _channel(RESULT),
        "channel-empty-register": _channel(_register("", "")),
        "channel-register-without-job": _channel(_register("", "g")),
        "channel-register-long-job": _channel(_register(LONG)),
        "channel-register-long-group": _channel(_register("new", LONG)),
        "channel-register-transitioning": _channel(_register("new", state=JobState.TRANSITIONING)),
        "channel-empty-first-message": _channel(pb.WorkloadMessage()),
        "channel-no-message": _channel(end=True),
        "channel-truncated-register": _channel(b"\x0a\x05\x0a\x03ab"),
    },
    Status.NOT_FOUND: {
        "snapshot-unknown-job-no-backend": _unary("snapshot", snapshot("ghost", "g")),
        "restore-unknown-job": _unary("restore", restore("ghost", "g", NOOP)),
        "restore-unknown-job-no-backend": _unary("restore", restore("ghost", "g")),
        "snapshot-job-of-another-group": _unary("snapshot", snapshot("running", "other")),
        "get-operation-unknown": _get("op-999"),
        "get-operation-unknown-waiting": _get("op-999", wait_ms=100),
        "reset-unknown-job": _reset("ghost"),
    },
    Status.FAILED_PRECONDITION: {
        "restore-running-job": _unary("restore", restore("running", "g")),
        "snapshot-saved-job": _unary("snapshot", snapshot("saved", "g")),
        "snapshot-while-one-runs": _unary("snapshot", snapshot("busy", "b", APP_CHANNEL)),
        "snapshot-while-one-runs-no-backend": _unary("snapshot", snapshot("busy", "b")),
        "restore-while-one-runs": _unary("restore", restore("busy", "b")),
        "snapshot-other-backend": _unary("snapshot", snapshot("running", "g", APP_CHANNEL)),
        "snapshot-app-channel-unregistered": _unary(
            "snapshot", snapshot("ghost", "g", APP_CHANNEL)
        ),
        "snapshot-disabled-backend": _unary(
            "snapshot", snapshot("ghost", "g", pb.BackendConfig(cuda=pb.CudaBackendConfig(PIDS)))
        ),
        # The deprecated `backend` field (3) set to BACKEND_CUDA, as a v1alpha1 caller sends it.
        "snapshot-legacy-cuda-disabled": _raw("Snapshot", b"\x0a\x05ghost\x12\x01g\x18\x01"),
        "snapshot-direct-memory": _unary(
            "snapshot",
            snapshot(
                "ghost", "g", pb.BackendConfig(direct_memory=pb.DirectMemoryBackendConfig(PIDS))
            ),
        ),
        "restore-direct-memory": _unary(
            "restore",
            restore(
                "saved", "g", pb.BackendConfig(direct_memory=pb.DirectMemoryBackendConfig(PIDS))
            ),
        ),
        "snapshot-memory-regions": _unary(
            "snapshot",
            snapshot(
                "ghost",
                "g",
                pb.BackendConfig(
                    memory_regions=pb.MemoryRegionsBackendConfig(
                        [pb.MemoryRegion(pid=1, address=4096, size_bytes=4096)]
                    )
                ),
            ),
        ),  # fmt: skip
        "reset-running-job": _reset("running"),
        "reset-busy-job": _reset("busy", "b"),
        "channel-register-busy-job": _channel(_register("busy", "b")),
        "channel-register-noop-job": _channel(_register("running")),
    },
    Status.ABORTED: {
        "snapshot-stale-token": _unary("snapshot", snapshot("running", "g", fencing_token=4)),
        "restore-stale-token": _unary("restore", restore("saved", "g", fencing_token=1)),
        "snapshot-new-job-stale-token": _unary(
            "snapshot", snapshot("ghost", "g", NOOP, fencing_token=2)
        ),
    },
    Status.RESOURCE_EXHAUSTED: {
        "snapshot-over-4MiB": _raw("Snapshot", bytes(snapshot("r" * 4 * MiB, "g", NOOP))),
        "get-operation-over-4MiB": _raw("GetOperation", b"\x0a\x01a" + b"\x00" * (4 * MiB)),
        "channel-register-over-4MiB": _channel(_register("r" * 4 * MiB)),
    },
}


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        pytest.param(call, status, id=name)
        for status, calls in BAD_INPUT.items()
        for name, call in calls.items()
    ],
)
async def test_bad_input_gets_a_clear_status_and_changes_nothing(
    agent: Agent, stub: Stub, call: Call, expected: Status
) -> None:
    await run_operation(stub, snapshot("saved", "g", NOOP, fencing_token=5))
    await run_operation(stub, snapshot("running", "g", NOOP))
    await run_operation(stub, restore("running", "g"))
    async with workload(agent.address, "w", "g"), workload(agent.address, "busy", "b") as busy:
        busy_op = (await stub.snapshot(snapshot("busy", "b", APP_CHANNEL))).operation_id
        assert busy_op == "op-4"
        command = await busy.command()
        before = await everything(stub)

        error = await grpc_error(call(stub, agent.address))
        assert error.status == expected, error
        assert error.message

        assert await everything(stub) == before
        # Still serving: the operation under way ends as usual, and the others move.
        await busy.answer(command)
        assert (await finish_operation(stub, busy_op)).status == OpStatus.COMPLETE
        assert (await run_operation(stub, restore("saved", "g", fencing_token=5))).status == (
            OpStatus.COMPLETE
        )
        assert await states(stub) == {
            "saved": JobState.RUNNING, "running": JobState.RUNNING, "w": JobState.RUNNING,
            "busy": JobState.SAVED,
        }  # fmt: skip


async def test_an_unknown_backend_is_refused_with_the_installed_ones_listed(stub: Stub) -> None:
    error = await grpc_error(stub.snapshot(snapshot("j", "g", _named("nope"))))
    assert error.status == Status.INVALID_ARGUMENT
    message = error.message or ""
    assert "nope" in message
    for name in ("noop", "app_channel", "app_endpoint"):
        assert name in message
    assert await jobs(stub) == {}


async def test_a_disabled_backend_is_refused() -> None:
    async with Agent(node_name="n1", db=None, backends=("noop",)) as agent:
        async with agent_stubs(agent.address) as stubs:
            stub = stubs.agent
            error = await grpc_error(stub.snapshot(snapshot("j", "g", APP_CHANNEL)))
            assert error.status == Status.FAILED_PRECONDITION
            assert "app_channel" in (error.message or "")
            register = _register("j")
            error = await grpc_error(workload_channel_raw(agent.address, [bytes(register)]))
            assert error.status == Status.FAILED_PRECONDITION
            assert await jobs(stub) == {}
            assert await health_status(stubs, "app_channel") == Status.NOT_FOUND
            assert (await run_operation(stub, snapshot("j", "g", NOOP))).status == (
                OpStatus.COMPLETE
            )
        agent.table.validate()


async def test_endpoints_another_job_owns_are_refused(agent: Agent, stub: Stub) -> None:
    async with FakeInferenceServer("vllm") as server:
        first = await run_operation(stub, snapshot("a", "g", _endpoint(pb.App.VLLM, server.url)))
        assert first.status == OpStatus.COMPLETE, first
        assert server.sleeping
        before = await everything(stub)
        for job, group in (("b", "g"), ("b", "other")):
            error = await grpc_error(
                stub.snapshot(snapshot(job, group, _endpoint(pb.App.VLLM, server.url + "/")))
            )
            assert error.status == Status.ALREADY_EXISTS, error
            assert "belong to job a" in (error.message or "")
        assert await everything(stub) == before
        assert len(server.calls("/sleep")) == 1
        back = await run_operation(stub, restore("a", "g"))
        assert back.status == OpStatus.COMPLETE
        assert not server.sleeping


def _cuda(*pids: int) -> pb.BackendConfig:
    return pb.BackendConfig(cuda=pb.CudaBackendConfig(pb.ProcessTarget(pids=list(pids))))


@pytest.fixture
async def processes() -> AsyncIterator[tuple[list[int], int]]:
    """Two live processes, and the pid of one that has exited."""
    live = [await asyncio.create_subprocess_exec("sleep", "60") for _ in range(2)]
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    try:
        yield [p.pid for p in live], gone.pid
    finally:
        for process in live:
            process.kill()
            await process.wait()


async def test_processes_that_do_not_exist_or_belong_to_another_job_are_refused(
    agent: Agent, stubs: AgentStubs, processes: tuple[list[int], int]
) -> None:
    stub = stubs.agent
    (first, second), gone = processes
    cuda = FakeCuda()
    cuda.add_process(first, device_bytes=3 * MiB)
    cuda.add_process(second, device=1, device_bytes=5 * MiB)
    context = BackendContext(agent.config.node_name, agent.channels)
    agent.backends["cuda"] = CudaBackend(context, cuda.module(), FakeNvml(cuda).module())

    done = await run_operation(stub, snapshot("a", "g", _cuda(first)))
    assert done.status == OpStatus.COMPLETE, done
    assert (done.backend, done.storage_bytes, done.snapshot_device_bytes) == ("cuda", 3 * MiB,
                                                                              3 * MiB)  # fmt: skip
    assert cuda.state_of(first).name == "CU_PROCESS_STATE_CHECKPOINTED"
    before = await everything(stub)
    calls = len(cuda.calls)

    refused = {
        "taken": (_cuda(first), Status.ALREADY_EXISTS, f"pid:{first} already belong to job a"),
        "partly-taken": (_cuda(second, first), Status.ALREADY_EXISTS, f"pid:{first}"),
        "gone": (_cuda(gone), Status.NOT_FOUND, f"pid {gone} does not exist"),
        "not-cuda": (_cuda(os.getppid()), Status.NOT_FOUND, "not a CUDA process"),
        "none": (_cuda(), Status.INVALID_ARGUMENT, "pids"),
        "zero": (_cuda(0), Status.INVALID_ARGUMENT, "not a process id"),
        "negative": (_cuda(-5), Status.INVALID_ARGUMENT, "not a process id"),
        "repeated": (_cuda(second, second), Status.INVALID_ARGUMENT, "repeat"),
        "the-agent": (_cuda(os.getpid()), Status.INVALID_ARGUMENT, "cannot checkpoint the agent"),
    }
    for name, (config, status, says) in refused.items():
        for group in ("g", "other"):
            error = await grpc_error(stub.snapshot(snapshot(f"b-{name}", group, config)))
            assert (error.status, says in (error.message or "")) == (status, True), (name, error)
    assert await everything(stub) == before
    assert all(call == "cuCheckpointProcessGetState" for call, _ in cuda.calls[calls:])
    assert cuda.state_of(second).name == "CU_PROCESS_STATE_RUNNING"

    # A job keeps its processes for as long as it is known; the others are free.
    other = await run_operation(stub, snapshot("b", "g", _cuda(second)))
    assert (other.status, other.storage_bytes) == (OpStatus.COMPLETE, 5 * MiB)
    back = await run_operation(stub, restore("a", "g"))
    assert back.status == OpStatus.COMPLETE
    assert cuda.state_of(first).name == "CU_PROCESS_STATE_RUNNING"
    assert await states(stub) == {"a": JobState.RUNNING, "b": JobState.SAVED}


# --- health ------------------------------------------------------------------------------


BROKEN_PLUGIN = """\
import timeslice_missing_dependency  # not installed: the backend cannot load
"""


@pytest.fixture
def broken_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A backend package installed on the path whose import fails."""
    site = tmp_path / "site"
    (site / "broken_backend-1.0.dist-info").mkdir(parents=True)
    (site / "broken_backend-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken-backend\nVersion: 1.0\n"
    )
    (site / "broken_backend-1.0.dist-info" / "entry_points.txt").write_text(
        "[timeslice.backends]\nbroken = broken_backend:Backend\n"
    )
    (site / "broken_backend.py").write_text(textwrap.dedent(BROKEN_PLUGIN))
    monkeypatch.syspath_prepend(str(site))
    yield "broken"
    sys.modules.pop("broken_backend", None)


async def test_health_answers_for_the_agent_and_for_each_backend(broken_backend: str) -> None:
    backends = ("noop", "app_channel", broken_backend)
    async with Agent(node_name="n1", db=None, backends=backends) as agent:
        assert set(agent.backends) == {"noop", "app_channel"}
        assert broken_backend in agent.unavailable
        async with agent_stubs(agent.address) as stubs:
            assert await health_status(stubs) == Serving.SERVING
            assert await health_status(stubs, "snapshot_agent.v1alpha1.SnapshotAgentService") == (
                Serving.SERVING
            )
            assert await health_status(stubs, "noop") == Serving.SERVING
            assert await health_status(stubs, "app_channel") == Serving.SERVING
            assert await health_status(stubs, broken_backend) == Serving.NOT_SERVING
            assert await health_status(stubs, "nonexistent") == Status.NOT_FOUND
            # Watch starts with the same answer.
            async for answer in stubs.health.watch(health.HealthCheckRequest(service="noop")):
                assert answer.status == Serving.SERVING
                break
            # Asking the broken backend for work says why it cannot serve.
            error = await grpc_error(stubs.agent.snapshot(snapshot("j", "g", _named("broken"))))
            assert error.status == Status.FAILED_PRECONDITION
            assert "timeslice_missing_dependency" in (error.message or "")


async def test_a_backend_that_fails_to_start_is_not_serving() -> None:
    options = {"app_endpoint": {"app_endpoint.timeout_s": "-1"}}
    async with Agent(node_name="n1", db=None, backends=("noop", "app_endpoint"),
                     backend_options=options) as agent:  # fmt: skip
        async with agent_stubs(agent.address) as stubs:
            assert await health_status(stubs, "app_endpoint") == Serving.NOT_SERVING
            assert await health_status(stubs, "noop") == Serving.SERVING
            assert await health_status(stubs) == Serving.SERVING


async def test_closing_answers_waiting_calls_and_ends_workload_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = Agent(node_name="n1", db=None, backends=("noop", "app_channel"))
    await agent.start()
    asked = asyncio.Event()
    operation = agent.operation

    async def operation_asked(op_id: str, wait: float = 0.0) -> Any:
        asked.set()  # the GetOperation call is in the agent now
        return await operation(op_id, wait)

    monkeypatch.setattr(agent, "operation", operation_asked)
    try:
        async with agent_stubs(agent.address) as stubs:
            async with workload(agent.address, "w", "g") as job:
                op_id = (await stubs.agent.snapshot(snapshot("w", "g", APP_CHANNEL))).operation_id
                await job.command()
                waiting = asyncio.ensure_future(
                    stubs.agent.get_operation(
                        pb.GetOperationRequest(operation_id=op_id, wait_ms=20_000)
                    )
                )
                await asyncio.wait_for(asked.wait(), 5)
                closing = asyncio.ensure_future(agent.close())
                # The waiting GetOperation is answered, the workload's stream ended.
                answer = await asyncio.wait_for(waiting, 5)
                assert answer.status in (OpStatus.PENDING, OpStatus.FAILED)
                assert await job.ended() is None
                await asyncio.wait_for(closing, 10)
    finally:
        await agent.close()
    assert agent.table.operations[op_id].status.value == "FAILED"
    assert agent.table.operations[op_id].error


async def test_a_health_watch_stays_open_and_says_not_serving_when_the_agent_closes() -> None:
    import grpclib.client

    from timeslice.api.gen.grpc.health import v1 as health_pb

    agent = Agent(node_name="n1", backends=("noop",))
    await agent.start()
    host, port = agent.address.rsplit(":", 1)
    channel = grpclib.client.Channel(host, int(port))
    try:
        stub = health_pb.HealthStub(channel)
        seen: list[health_pb.HealthCheckResponseServingStatus] = []

        async def watch() -> None:
            async for answer in stub.watch(health_pb.HealthCheckRequest()):
                seen.append(answer.status)

        watching = asyncio.ensure_future(watch())
        await until(lambda: seen, "the first answer")
        await asyncio.sleep(0.2)  # nothing changes for a while
        assert seen == [health_pb.HealthCheckResponseServingStatus.SERVING]
        assert not watching.done()  # the stream stays open while nothing changes
        await asyncio.wait_for(agent.close(), 5)
        await asyncio.wait_for(asyncio.gather(watching, return_exceptions=True), 5)
        assert seen == [
            health_pb.HealthCheckResponseServingStatus.SERVING,
            health_pb.HealthCheckResponseServingStatus.NOT_SERVING,
        ]
    finally:
        channel.close()
