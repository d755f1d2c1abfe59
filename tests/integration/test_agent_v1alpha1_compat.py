"""A program written against the v1alpha1 agent protocol alone works unchanged
against our Agent.

The v1alpha1 protocol (tests/compat/v1alpha1_agent.proto) and the standard
health protocol are compiled at test time with the official protobuf and gRPC
tools, and the Agent is driven with the official `grpcio` stubs: another gRPC
implementation and another protobuf runtime than the ones timeslice uses. The
workload is a v1alpha1 one too: a blocking bidirectional stream fed by a
generator, read on a thread of its own.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from timeslice.agent.server import Agent

from grpcio_compat import compiled, serving_in_thread

pytestmark = pytest.mark.timeout(60)

PROTOS = ("v1alpha1_agent.proto", "grpc_health_v1.proto")
CALL_TIMEOUT = 10.0


class V1alpha1:
    """The generated modules: agent messages and stub, health messages and stub."""

    def __init__(self, modules: dict[str, ModuleType]) -> None:
        self.pb2 = modules["v1alpha1_agent_pb2"]
        self.grpc = modules["v1alpha1_agent_pb2_grpc"]
        self.health_pb2 = modules["grpc_health_v1_pb2"]
        self.health_grpc = modules["grpc_health_v1_pb2_grpc"]


@pytest.fixture(scope="module")
def v1alpha1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1alpha1]:
    with compiled(PROTOS, tmp_path_factory.mktemp("v1alpha1_agent_gen")) as modules:
        yield V1alpha1(modules)


@pytest.fixture
def agent_address(tmp_path: Path) -> Iterator[str]:
    """An Agent serving from a background thread with its own event loop; its job
    table is checked when it stops."""
    db = f"sqlite:///{tmp_path / 'agent.db'}"

    def agent() -> Agent:
        return Agent(node_name="n1", db=db, backends=("noop", "app_channel"))

    with serving_in_thread(agent, "agent", lambda a: a.table.validate()) as address:
        yield address


def channel_to(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])


class V1alpha1Workload:
    """A workload as a v1alpha1 program writes it: a request generator fed from a
    queue, and the agent's commands read on a thread. Each command is answered
    with `reply(command)`, a CommandResult."""

    def __init__(self, gen: V1alpha1, address: str, job: str, group: str,
                 capabilities: Any = None, ok: bool = True) -> None:  # fmt: skip
        self.pb2 = gen.pb2
        self.job, self.group, self.ok = job, group, ok
        self.channel = channel_to(address)
        self.stub = gen.grpc.SnapshotAgentServiceStub(self.channel)
        self.commands: queue.Queue[Any] = queue.Queue()
        self._outgoing: queue.Queue[Any] = queue.Queue()
        register = self.pb2.RegisterWorkload(job_id=job, group=group, capabilities=capabilities)
        self._outgoing.put(self.pb2.WorkloadMessage(register=register))
        self._responses = self.stub.WorkloadChannel(self._requests(), timeout=60)
        self.ended: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name=f"workload-{job}", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[Any]:
        while (message := self._outgoing.get()) is not None:
            yield message

    def _read(self) -> None:
        try:
            for command in self._responses:
                self.commands.put(command)
                error = "" if self.ok else "the workload could not free its memory"
                result = self.pb2.CommandResult(
                    command_id=command.command_id, ok=self.ok, error=error
                )
                self._outgoing.put(self.pb2.WorkloadMessage(result=result))
        except grpc.RpcError as exc:
            self.ended = exc
        finally:
            self.commands.put(None)

    def next_command(self, timeout: float = 5.0) -> Any:
        command = self.commands.get(timeout=timeout)
        assert command is not None, f"the stream ended: {self.ended}"
        return command

    def close(self) -> None:
        self._outgoing.put(None)
        self._reader.join(10)
        assert not self._reader.is_alive(), "the agent did not end the workload's stream"
        self.channel.close()


class V1alpha1Client:
    """A scheduler as a v1alpha1 program writes it: it polls GetOperation."""

    def __init__(self, gen: V1alpha1, address: str) -> None:
        self.pb2 = gen.pb2
        self.channel = channel_to(address)
        self.stub = gen.grpc.SnapshotAgentServiceStub(self.channel)
        self.health = gen.health_grpc.HealthStub(self.channel)
        self.health_pb2 = gen.health_pb2

    def app_channel(self, mode: int = 0) -> Any:
        return self.pb2.BackendConfig(app_channel=self.pb2.AppChannelConfig(mode=mode))

    def snapshot(self, job: str, group: str, config: Any) -> str:
        request = self.pb2.SnapshotRequest(job_id=job, group=group, backend_config=config)
        return str(self.stub.Snapshot(request, timeout=CALL_TIMEOUT).operation_id)

    def restore(self, job: str, group: str, config: Any = None) -> str:
        request = self.pb2.RestoreRequest(job_id=job, group=group, backend_config=config)
        return str(self.stub.Restore(request, timeout=CALL_TIMEOUT).operation_id)

    def wait(self, op_id: str, timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        request = self.pb2.GetOperationRequest(operation_id=op_id)
        while (answer := self.stub.GetOperation(request, timeout=CALL_TIMEOUT)).status == (
            self.pb2.OPERATION_STATUS_PENDING
        ):
            assert time.monotonic() < deadline, f"operation {op_id} still pending"
            time.sleep(0.01)
        return answer

    def states(self) -> dict[str, int]:
        status = self.stub.Status(self.pb2.StatusRequest(), timeout=CALL_TIMEOUT)
        return {job.job_id: job.state for job in status.job_statuses}

    def wait_for_state(self, job: str, state: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.states().get(job) != state:
            assert time.monotonic() < deadline, f"{job} is {self.states().get(job)}, not {state}"
            time.sleep(0.01)

    def close(self) -> None:
        self.channel.close()


def test_a_v1alpha1_workload_and_scheduler_snapshot_and_restore(
    v1alpha1: V1alpha1, agent_address: str
) -> None:
    pb2 = v1alpha1.pb2
    client = V1alpha1Client(v1alpha1, agent_address)
    discarding = pb2.WorkloadCapabilities(default_mode=pb2.SUSPEND_MODE_DISCARD)
    plain = V1alpha1Workload(v1alpha1, agent_address, "trainer", "gpus")
    other = V1alpha1Workload(v1alpha1, agent_address, "rollout", "gpus", discarding)
    try:
        client.wait_for_state("trainer", pb2.JOB_STATE_RUNNING)
        client.wait_for_state("rollout", pb2.JOB_STATE_RUNNING)

        for workload, mode in ((plain, pb2.SUSPEND_MODE_OFFLOAD),
                               (other, pb2.SUSPEND_MODE_DISCARD)):  # fmt: skip
            op_id = client.snapshot(workload.job, "gpus", client.app_channel())
            assert op_id
            command = workload.next_command()
            assert command.WhichOneof("command") == "snapshot"
            assert command.snapshot.mode == mode  # resolved, never unspecified
            assert command.command_id
            done = client.wait(op_id)
            assert done.status == pb2.OPERATION_STATUS_COMPLETE
            assert not done.HasField("error")
            assert done.elapsed_ms >= 0
            assert client.states()[workload.job] == pb2.JOB_STATE_SAVED

        # An explicit mode is passed on as it is.
        op_id = client.restore("trainer", "gpus")
        assert plain.next_command().WhichOneof("command") == "restore"
        assert client.wait(op_id).status == pb2.OPERATION_STATUS_COMPLETE
        op_id = client.snapshot("trainer", "gpus", client.app_channel(pb2.SUSPEND_MODE_DISCARD))
        assert plain.next_command().snapshot.mode == pb2.SUSPEND_MODE_DISCARD
        assert client.wait(op_id).status == pb2.OPERATION_STATUS_COMPLETE

        for workload in (plain, other):
            op_id = client.restore(workload.job, "gpus", client.app_channel())
            command = workload.next_command()
            assert command.WhichOneof("command") == "restore"
            assert client.wait(op_id).status == pb2.OPERATION_STATUS_COMPLETE
        assert client.states() == {"trainer": pb2.JOB_STATE_RUNNING,
                                   "rollout": pb2.JOB_STATE_RUNNING}  # fmt: skip
        status = client.stub.Status(pb2.StatusRequest(), timeout=CALL_TIMEOUT)
        assert list(status.accelerator_statuses) == []

        answer = client.health.Check(v1alpha1.health_pb2.HealthCheckRequest(), timeout=5)
        assert answer.status == v1alpha1.health_pb2.HealthCheckResponse.SERVING
    finally:
        plain.close()
        other.close()
        client.close()
    assert plain.ended is None and other.ended is None


def test_a_failing_v1alpha1_workload_faults_only_its_own_job(
    v1alpha1: V1alpha1, agent_address: str
) -> None:
    pb2 = v1alpha1.pb2
    client = V1alpha1Client(v1alpha1, agent_address)
    failing = V1alpha1Workload(v1alpha1, agent_address, "broken", "gpus", ok=False)
    fine = V1alpha1Workload(v1alpha1, agent_address, "fine", "gpus")
    try:
        client.wait_for_state("broken", pb2.JOB_STATE_RUNNING)
        client.wait_for_state("fine", pb2.JOB_STATE_RUNNING)
        op_id = client.snapshot("broken", "gpus", client.app_channel())
        failing.next_command()
        failed = client.wait(op_id)
        assert failed.status == pb2.OPERATION_STATUS_FAILED
        assert "could not free its memory" in failed.error
        assert not failed.HasField("storage_bytes")
        assert client.states()["broken"] == pb2.JOB_STATE_FAULTED

        op_id = client.snapshot("fine", "gpus", client.app_channel())
        fine.next_command()
        assert client.wait(op_id).status == pb2.OPERATION_STATUS_COMPLETE
        assert client.states() == {"broken": pb2.JOB_STATE_FAULTED, "fine": pb2.JOB_STATE_SAVED}
    finally:
        failing.close()
        fine.close()
        client.close()


def test_v1alpha1_programs_get_the_standard_status_codes(
    v1alpha1: V1alpha1, agent_address: str
) -> None:
    pb2 = v1alpha1.pb2
    client = V1alpha1Client(v1alpha1, agent_address)
    workload = V1alpha1Workload(v1alpha1, agent_address, "w", "gpus")
    pids = pb2.ProcessTarget(pids=[12345])
    try:
        client.wait_for_state("w", pb2.JOB_STATE_RUNNING)
        cases = [
            (lambda: client.stub.GetOperation(pb2.GetOperationRequest(operation_id="op-999"),
                                              timeout=CALL_TIMEOUT), grpc.StatusCode.NOT_FOUND),
            (lambda: client.restore("w", "gpus"), grpc.StatusCode.FAILED_PRECONDITION),
            (lambda: client.snapshot("nobody", "gpus", None), grpc.StatusCode.NOT_FOUND),
            (lambda: client.restore("", "gpus", client.app_channel()),
             grpc.StatusCode.INVALID_ARGUMENT),
            # The deprecated field, as an older caller sets it: cuda is not served here.
            (lambda: client.stub.Snapshot(pb2.SnapshotRequest(job_id="x", group="gpus",
                                                              backend=pb2.BACKEND_CUDA),
                                          timeout=CALL_TIMEOUT),
             grpc.StatusCode.FAILED_PRECONDITION),
            (lambda: client.snapshot("x", "gpus", pb2.BackendConfig(
                direct_memory=pb2.DirectMemoryBackendConfig(explicit_target=pids))),
             grpc.StatusCode.FAILED_PRECONDITION),
        ]  # fmt: skip
        for call, code in cases:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == code, caught.value
            assert caught.value.details()
        assert client.states() == {"w": pb2.JOB_STATE_RUNNING}

        # A workload whose first message is not `register` is refused.
        bad = client.stub.WorkloadChannel(
            iter([pb2.WorkloadMessage(result=pb2.CommandResult(command_id="c", ok=True))]),
            timeout=CALL_TIMEOUT,
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        workload.close()
        client.close()
