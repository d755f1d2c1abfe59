"""The agent clients against a small in-test agent over real gRPC.

`FakeAgent` starts an operation per Snapshot or Restore and finishes it when
the test says (or after `finish_after` seconds); its GetOperation holds the
call open for `wait_ms` like ours, or answers at once like a v1alpha1 agent
(`honours_wait = False`). Statuses can be injected for the next calls of a
method.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.testing import ChannelFor

from local_servers import Proxy, free_address, start_server, stop_server

from timeslice.api.gen.grpc.health import v1 as health_pb
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client import agent as agent_module
from timeslice.client.agent import (
    DEFAULT_ENDPOINT,
    AsyncSnapshotAgentClient,
    OperationFailedError,
    SnapshotAgentClient,
    SnapshotAgentError,
)
from timeslice.client.agent_types import (
    AcceleratorStatus,
    GetOperationResponse,
    HealthResponse,
    JobStatus,
    ResetJobResponse,
    RestoreResponse,
    SnapshotResponse,
    StatusResponse,
    app_channel_config,
    app_endpoint_config,
    cuda_config,
    named_backend,
)
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    TimeSliceError,
    UnavailableError,
    UnimplementedError,
)

PENDING = pb.OperationStatus.PENDING
COMPLETE = pb.OperationStatus.COMPLETE
FAILED = pb.OperationStatus.FAILED


class FakeAgent(pb.SnapshotAgentServiceBase):
    def __init__(self) -> None:
        self.calls: dict[str, list[Any]] = defaultdict(list)
        self.fail_next: dict[str, list[Status]] = defaultdict(list)
        self.fail_always: dict[str, Status] = {}
        self.operations: dict[str, pb.GetOperationResponse] = {}
        self.finished: dict[str, asyncio.Event] = {}
        self.honours_wait = True
        self.wait_cap_sec: float | None = None
        self.finish_after: float | None = None
        self.finish_error: str | None = None
        self.snapshot_gate: asyncio.Event | None = None
        self.status_answer = pb.StatusResponse()
        self.reset_state = pb.JobState.IDLE

    def _receive(self, method: str, request: Any) -> None:
        self.calls[method].append(request)
        if self.fail_next[method]:
            raise GRPCError(self.fail_next[method].pop(0), f"injected into {method}")
        if method in self.fail_always:
            raise GRPCError(self.fail_always[method], f"injected into {method}")

    def _start(self, kind: str, job_id: str, group: str) -> str:
        operation_id = f"op-{len(self.operations) + 1}"
        self.operations[operation_id] = pb.GetOperationResponse(
            status=PENDING, job_id=job_id, group=group, kind=kind, backend="noop"
        )
        self.finished[operation_id] = asyncio.Event()
        if self.finish_after is not None:
            asyncio.get_running_loop().call_later(
                self.finish_after, self.finish, operation_id, self.finish_error
            )
        return operation_id

    def finish(self, operation_id: str, error: str | None = None) -> None:
        operation = self.operations[operation_id]
        if error is None:
            operation.status = COMPLETE
            operation.storage_bytes = 1 << 20
            operation.snapshot_device_bytes = 1 << 21
        else:
            operation.status = FAILED
            operation.error = error
        operation.elapsed_ms = 12
        self.finished[operation_id].set()

    async def snapshot(self, message: pb.SnapshotRequest) -> pb.SnapshotResponse:
        self._receive("snapshot", message)
        if self.snapshot_gate is not None:
            await self.snapshot_gate.wait()
        return pb.SnapshotResponse(
            operation_id=self._start("snapshot", message.job_id, message.group)
        )

    async def restore(self, message: pb.RestoreRequest) -> pb.RestoreResponse:
        self._receive("restore", message)
        return pb.RestoreResponse(
            operation_id=self._start("restore", message.job_id, message.group)
        )

    async def get_operation(self, message: pb.GetOperationRequest) -> pb.GetOperationResponse:
        self._receive("get_operation", message)
        operation = self.operations.get(message.operation_id)
        if operation is None:
            raise GRPCError(Status.NOT_FOUND, f"no operation {message.operation_id}")
        if self.honours_wait and message.wait_ms and operation.status == PENDING:
            wait = message.wait_ms / 1000
            if self.wait_cap_sec is not None:
                wait = min(wait, self.wait_cap_sec)
            with contextlib.suppress(TimeoutError):
                finished = self.finished.setdefault(message.operation_id, asyncio.Event())
                await asyncio.wait_for(finished.wait(), wait)
        return operation

    async def status(self, message: pb.StatusRequest) -> pb.StatusResponse:
        self._receive("status", message)
        return self.status_answer

    async def reset_job(self, message: pb.ResetJobRequest) -> pb.ResetJobResponse:
        self._receive("reset_job", message)
        return pb.ResetJobResponse(state=self.reset_state)


class FakeHealth(health_pb.HealthBase):
    def __init__(self) -> None:
        self.statuses = {
            "": health_pb.HealthCheckResponseServingStatus.SERVING,
            "cuda": health_pb.HealthCheckResponseServingStatus.NOT_SERVING,
        }

    async def check(self, message: health_pb.HealthCheckRequest) -> health_pb.HealthCheckResponse:
        if message.service not in self.statuses:
            raise GRPCError(Status.NOT_FOUND, f"unknown service {message.service!r}")
        return health_pb.HealthCheckResponse(status=self.statuses[message.service])


@pytest.fixture
def fake() -> FakeAgent:
    return FakeAgent()


@pytest.fixture
async def address(fake: FakeAgent) -> AsyncIterator[str]:
    server, address = await start_server([fake, FakeHealth()])
    yield address
    await stop_server(server)


ClientFactory = Callable[..., AsyncSnapshotAgentClient]


@pytest.fixture
async def make_client(address: str) -> AsyncIterator[ClientFactory]:
    clients: list[AsyncSnapshotAgentClient] = []

    def make(**options: Any) -> AsyncSnapshotAgentClient:
        options.setdefault("endpoint", address)
        client = AsyncSnapshotAgentClient(**options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
def client(make_client: ClientFactory) -> AsyncSnapshotAgentClient:
    return make_client()


# --- field mapping -------------------------------------------------------------------


async def test_snapshot_sends_every_field_and_returns_the_operation(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    config = app_channel_config("discard", ["weights"])
    answer = await client.snapshot(
        "job-1", "g", backend_config=config, fencing_token=7, timeout_sec=2.5
    )
    assert answer == SnapshotResponse(operation_id="op-1")
    [request] = fake.calls["snapshot"]
    assert (request.job_id, request.group) == ("job-1", "g")
    assert request.backend_config == config
    assert request.fencing_token == 7 and request.timeout_ms == 2500
    assert request.backend == pb.Backend.UNSPECIFIED


async def test_restore_sends_every_field_and_returns_the_operation(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    config = named_backend("noop", delay_ms="5")
    answer = await client.restore("job-1", "g", config, fencing_token=3, timeout_sec=0.0004)
    assert answer == RestoreResponse(operation_id="op-1")
    [request] = fake.calls["restore"]
    assert (request.job_id, request.group, request.fencing_token) == ("job-1", "g", 3)
    assert request.backend_config.named == pb.NamedBackendConfig("noop", {"delay_ms": "5"})
    assert request.timeout_ms == 1  # never rounded down to "no deadline"


async def test_calls_without_extensions_send_what_a_v1alpha1_client_sends(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    await client.snapshot("job-1")
    await client.restore("job-1")
    for request in fake.calls["snapshot"] + fake.calls["restore"]:
        assert request.group == "" and request.backend_config is None
        assert request.fencing_token == 0 and request.timeout_ms is None
        assert not request.is_set("backend")


@pytest.mark.parametrize("backend", ["cuda", "CUDA", "BACKEND_CUDA", " Cuda ", 1, pb.Backend.CUDA])
async def test_the_deprecated_backend_is_accepted_by_name_or_value(
    fake: FakeAgent, client: AsyncSnapshotAgentClient, backend: str | int
) -> None:
    await client.snapshot("job-1", "g", backend=backend)
    await client.restore("job-1", "g", backend=backend)
    assert fake.calls["snapshot"][0].backend == pb.Backend.CUDA
    assert fake.calls["restore"][0].backend == pb.Backend.CUDA


@pytest.mark.parametrize("backend", ["tpu", "", 7, -1, True])
async def test_an_unknown_backend_is_refused_before_sending(
    fake: FakeAgent, client: AsyncSnapshotAgentClient, backend: str | int
) -> None:
    with pytest.raises(InvalidArgumentError, match="backend"):
        await client.snapshot("job-1", "g", backend=backend)
    assert fake.calls["snapshot"] == []


async def test_a_backend_config_decides_the_deprecated_enum(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    await client.snapshot("job-1", backend_config=cuda_config([42]))
    await client.snapshot("job-1", backend="cuda", backend_config=named_backend("noop"))
    with_cuda, with_named = fake.calls["snapshot"]
    assert with_cuda.backend == pb.Backend.CUDA  # an agent that reads only the enum
    assert with_cuda.backend_config.cuda.explicit_target.pids == [42]
    assert with_named.backend == pb.Backend.UNSPECIFIED


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.snapshot(""), "job_id"),
        (lambda c: c.restore("j", fencing_token=-1), "fencing_token"),
        (lambda c: c.snapshot("j", timeout_sec=0), "timeout_sec"),
        (lambda c: c.wait_for_operation("op-1", timeout_sec=-1), "timeout_sec"),
        (lambda c: c.wait_for_operation("op-1", -0.5), "poll_interval_sec"),
        (lambda c: c.status(timeout_sec=-1), "timeout_sec"),
        (lambda c: c.reset_job(""), "job_id"),
    ],
)
async def test_bad_arguments_are_refused_before_sending(
    fake: FakeAgent, client: AsyncSnapshotAgentClient, call: Any, message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        await call(client)
    assert not any(fake.calls.values())


async def test_get_operation_maps_every_field(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.operations["done"] = pb.GetOperationResponse(
        status=COMPLETE,
        storage_bytes=0,
        snapshot_device_bytes=4096,
        elapsed_ms=250,
        job_id="job-1",
        group="g",
        kind="restore",
        backend="cuda",
    )
    fake.operations["failed"] = pb.GetOperationResponse(status=FAILED, error="", elapsed_ms=3)
    fake.operations["pending"] = pb.GetOperationResponse(status=PENDING)
    fake.operations["newer"] = pb.GetOperationResponse(status=pb.OperationStatus(9))

    assert await client.get_operation("done") == GetOperationResponse(
        status="OPERATION_STATUS_COMPLETE",
        elapsed_ms=250,
        storage_bytes=0,  # present, though zero
        snapshot_device_bytes=4096,
        error=None,
        job_id="job-1",
        group="g",
        kind="restore",
        backend="cuda",
    )
    failed = await client.get_operation("failed")
    assert (failed.status, failed.error, failed.storage_bytes) == (
        "OPERATION_STATUS_FAILED",
        "",
        None,
    )
    assert failed.finished
    pending = await client.get_operation("pending")
    assert pending == GetOperationResponse("OPERATION_STATUS_PENDING", 0)
    assert not pending.finished
    assert (await client.get_operation("newer")).status == "UNKNOWN(9)"
    assert all(request.wait_ms is None for request in fake.calls["get_operation"])
    with pytest.raises(NotFoundError, match="no operation"):
        await client.get_operation("nope")


async def test_status_maps_every_field(fake: FakeAgent, client: AsyncSnapshotAgentClient) -> None:
    fake.status_answer = pb.StatusResponse(
        job_statuses=[
            pb.JobStatus(job_id="a", state=pb.JobState.SAVED),
            pb.JobStatus(
                job_id="b",
                state=pb.JobState.FAULTED,
                group="g",
                backend="cuda",
                fault="the process went away",
                operation_id="op-3",
                liveness=pb.Liveness.GONE,
            ),
        ],
        accelerator_statuses=[pb.AcceleratorStatus("GPU-0", 10, 80)],
        node_name="node-7",
        version="1.2.3",
    )
    assert await client.status() == StatusResponse(
        job_statuses=[
            JobStatus("a", "JOB_STATE_SAVED"),
            JobStatus(
                "b", "JOB_STATE_FAULTED", "g", "cuda", "the process went away", "op-3", "GONE"
            ),
        ],
        accelerator_statuses=[AcceleratorStatus("GPU-0", 10, 80)],
        node_name="node-7",
        version="1.2.3",
    )
    fake.status_answer = pb.StatusResponse()
    assert await client.status() == StatusResponse([], [], "")


async def test_check_health(client: AsyncSnapshotAgentClient) -> None:
    assert await client.check_health() == HealthResponse(status="SERVING")
    assert await client.check_health("cuda") == HealthResponse(status="NOT_SERVING")
    with pytest.raises(NotFoundError, match="unknown service"):
        await client.check_health("tpu")


async def test_reset_job(fake: FakeAgent, client: AsyncSnapshotAgentClient) -> None:
    assert await client.reset_job("job-1", "g") == ResetJobResponse(state="JOB_STATE_IDLE")
    [request] = fake.calls["reset_job"]
    assert (request.job_id, request.group) == ("job-1", "g")


# --- waiting -------------------------------------------------------------------------


async def test_waiting_is_done_by_the_agent_not_by_polling(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.finish_after = 0.2
    operation_id = (await client.snapshot("job-1")).operation_id
    started = time.monotonic()
    done = await client.wait_for_operation(operation_id, poll_interval_sec=5)
    assert time.monotonic() - started < 1
    assert done.status == "OPERATION_STATUS_COMPLETE" and done.storage_bytes == 1 << 20
    assert [request.wait_ms for request in fake.calls["get_operation"]] == [30_000]


async def test_an_agent_that_does_not_wait_is_polled(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.honours_wait = False
    fake.finish_after = 0.3
    operation_id = (await client.snapshot("job-1")).operation_id
    started = time.monotonic()
    done = await client.wait_for_operation(operation_id, poll_interval_sec=0.05)
    assert time.monotonic() - started < 1
    assert done.status == "OPERATION_STATUS_COMPLETE"
    assert 3 <= len(fake.calls["get_operation"]) <= 10  # every 50 ms, not in a tight loop


async def test_an_agent_that_waits_less_than_asked_is_asked_again_at_once(
    fake: FakeAgent, client: AsyncSnapshotAgentClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "_EARLY_ANSWER_SEC", 0.05)
    fake.wait_cap_sec = 0.1
    fake.finish_after = 0.35
    operation_id = (await client.snapshot("job-1")).operation_id
    started = time.monotonic()
    await client.wait_for_operation(operation_id, poll_interval_sec=5)
    assert time.monotonic() - started < 1
    assert 3 <= len(fake.calls["get_operation"]) <= 5  # one per capped wait, no pause


async def test_a_wait_ends_at_its_limit(fake: FakeAgent, client: AsyncSnapshotAgentClient) -> None:
    operation_id = (await client.snapshot("job-1")).operation_id
    started = time.monotonic()
    with pytest.raises(
        DeadlineExceededError, match=f"{operation_id} still OPERATION_STATUS_PENDING"
    ):
        await client.wait_for_operation(operation_id, timeout_sec=0.3)
    assert 0.3 <= time.monotonic() - started < 0.8
    waits = [request.wait_ms for request in fake.calls["get_operation"]]
    assert waits and all(wait <= 300 for wait in waits)


async def test_a_wait_on_a_polled_agent_ends_at_its_limit(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.honours_wait = False
    operation_id = (await client.snapshot("job-1")).operation_id
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await client.wait_for_operation(operation_id, poll_interval_sec=5, timeout_sec=0.2)
    assert time.monotonic() - started < 0.6


async def test_snapshot_and_wait_returns_the_complete_operation(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.finish_after = 0.05
    done = await client.snapshot_and_wait("job-1", "g", backend_config=named_backend("noop"))
    assert done.status == "OPERATION_STATUS_COMPLETE"
    assert (done.job_id, done.group, done.kind) == ("job-1", "g", "snapshot")
    done = await client.restore_and_wait("job-1", "g", fencing_token=4, timeout_sec=5)
    assert done.kind == "restore"
    assert fake.calls["restore"][0].timeout_ms == 5000


async def test_a_failed_operation_raises_with_its_state(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.finish_after = 0.05
    fake.finish_error = "cuda-checkpoint exited 1"
    with pytest.raises(OperationFailedError, match="cuda-checkpoint exited 1") as raised:
        await client.snapshot_and_wait("job-1", "g")
    error = raised.value
    assert isinstance(error, TimeSliceError)
    assert "snapshot of job job-1 (operation op-1)" in str(error)
    assert error.operation_id == "op-1"
    assert error.response is not None and error.response.error == "cuda-checkpoint exited 1"
    with pytest.raises(OperationFailedError, match="restore"):
        await client.restore_and_wait("job-1", "g")


async def test_an_operation_that_outlasts_the_limit_raises_deadline_exceeded(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError, match="snapshot of job job-1") as raised:
        await client.snapshot_and_wait("job-1", timeout_sec=0.2)
    assert isinstance(raised.value, TimeoutError)
    assert time.monotonic() - started < 0.6
    # The agent is given the same limit, so the operation does not go on unwatched.
    assert fake.calls["snapshot"][0].timeout_ms == 200


# --- errors and retries --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (Status.INVALID_ARGUMENT, InvalidArgumentError),
        (Status.NOT_FOUND, NotFoundError),
        (Status.PERMISSION_DENIED, PermissionDeniedError),
        (Status.FAILED_PRECONDITION, ConflictError),
        (Status.ABORTED, LeaseLostError),
        (Status.RESOURCE_EXHAUSTED, ResourceExhaustedError),
        (Status.DEADLINE_EXCEEDED, DeadlineExceededError),
        (Status.UNAVAILABLE, UnavailableError),
        (Status.UNIMPLEMENTED, UnimplementedError),
        (Status.INTERNAL, InternalError),
    ],
)
@pytest.mark.parametrize("method", ["snapshot", "restore", "status", "reset_job"])
async def test_each_status_raises_its_exception(
    fake: FakeAgent,
    make_client: ClientFactory,
    status: Status,
    expected: type[TimeSliceError],
    method: str,
) -> None:
    fake.fail_always[method] = status
    client = make_client(reconnect_timeout_sec=0)
    call = {
        "snapshot": lambda: client.snapshot("job-1"),
        "restore": lambda: client.restore("job-1"),
        "status": client.status,
        "reset_job": lambda: client.reset_job("job-1"),
    }[method]
    with pytest.raises(expected, match=f"injected into {method}") as raised:
        await call()
    assert isinstance(raised.value, expected) and raised.value.status == status


async def test_reads_are_retried_while_the_agent_is_unavailable(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.operations["op-1"] = pb.GetOperationResponse(status=COMPLETE)
    fake.fail_next["get_operation"] = [Status.UNAVAILABLE, Status.UNAVAILABLE]
    fake.fail_next["status"] = [Status.UNAVAILABLE]
    assert (await client.wait_for_operation("op-1")).status == "OPERATION_STATUS_COMPLETE"
    await client.status()
    assert len(fake.calls["get_operation"]) == 3 and len(fake.calls["status"]) == 2


async def test_a_snapshot_the_agent_may_have_received_is_not_sent_again(
    fake: FakeAgent, client: AsyncSnapshotAgentClient
) -> None:
    fake.fail_next["snapshot"] = [Status.UNAVAILABLE]
    fake.fail_next["reset_job"] = [Status.UNAVAILABLE]
    with pytest.raises(UnavailableError):
        await client.snapshot("job-1")
    with pytest.raises(UnavailableError):
        await client.reset_job("job-1")
    assert len(fake.calls["snapshot"]) == len(fake.calls["reset_job"]) == 1


async def test_a_connection_lost_during_a_snapshot_raises_and_is_not_retried(
    fake: FakeAgent, address: str, make_client: ClientFactory
) -> None:
    proxy = Proxy(address)
    client = make_client(endpoint=await proxy.start())
    fake.snapshot_gate = asyncio.Event()
    try:
        snapshotting = asyncio.create_task(client.snapshot("job-1"))
        while not fake.calls["snapshot"]:
            await asyncio.sleep(0.01)
        proxy.cut()
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(snapshotting, 5)
        fake.snapshot_gate.set()
        await asyncio.sleep(0.1)
        assert len(fake.calls["snapshot"]) == 1
        # The client connects again for the next call.
        assert (await client.status()).job_statuses == []
    finally:
        await proxy.close()


async def test_a_snapshot_waits_for_an_agent_that_starts_late(fake: FakeAgent) -> None:
    address = free_address()
    async with AsyncSnapshotAgentClient(address) as client:
        snapshotting = asyncio.create_task(client.snapshot("job-1"))
        await asyncio.sleep(0.2)
        server, _ = await start_server([fake, FakeHealth()], int(address.rsplit(":", 1)[1]))
        try:
            assert (await snapshotting).operation_id == "op-1"
            assert len(fake.calls["snapshot"]) == 1
        finally:
            await client.close()
            await stop_server(server)


@pytest.mark.parametrize("method", ["snapshot", "status", "check_health"])
async def test_an_unreachable_agent_raises_unavailable(method: str) -> None:
    async with AsyncSnapshotAgentClient(free_address(), reconnect_timeout_sec=0.2) as client:
        started = time.monotonic()
        with pytest.raises(UnavailableError) as raised:
            await getattr(client, method)(*(["job-1"] if method == "snapshot" else []))
    assert isinstance(raised.value, ConnectionError)
    assert 0.2 <= time.monotonic() - started < 1


async def test_a_slow_answer_raises_deadline_exceeded(
    fake: FakeAgent, make_client: ClientFactory
) -> None:
    fake.snapshot_gate = asyncio.Event()
    client = make_client(call_timeout_sec=0.2)
    with pytest.raises(DeadlineExceededError):
        await client.snapshot("job-1")
    fake.snapshot_gate.set()


# --- the client itself ---------------------------------------------------------------


async def test_a_client_can_use_a_given_channel(fake: FakeAgent) -> None:
    async with ChannelFor([fake, FakeHealth()]) as channel:
        async with AsyncSnapshotAgentClient(channel=channel) as client:
            fake.finish_after = 0
            assert (await client.snapshot_and_wait("job-1")).kind == "snapshot"
            assert (await client.check_health()).status == "SERVING"
        # The channel is the caller's: still open after the client closed.
        assert (await pb.SnapshotAgentServiceStub(channel).status()).job_statuses == []


async def test_a_closed_client_refuses_calls(client: AsyncSnapshotAgentClient) -> None:
    await client.status()
    await client.close()
    await client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.status()


async def test_a_client_belongs_to_one_event_loop(client: AsyncSnapshotAgentClient) -> None:
    await client.status()
    with pytest.raises(RuntimeError, match="another event loop"):
        await asyncio.to_thread(asyncio.run, client.status())


def test_bad_endpoints_and_options_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="host:port"):
        AsyncSnapshotAgentClient("nohost")
    with pytest.raises(InvalidArgumentError, match="call_timeout_sec"):
        AsyncSnapshotAgentClient(call_timeout_sec=0)
    with pytest.raises(InvalidArgumentError, match="reconnect_timeout_sec"):
        AsyncSnapshotAgentClient(reconnect_timeout_sec=-1)
    assert AsyncSnapshotAgentClient().endpoint == DEFAULT_ENDPOINT == "127.0.0.1:9001"


# --- backend configurations ----------------------------------------------------------


def test_cuda_config() -> None:
    assert cuda_config([10, 11]) == pb.BackendConfig(
        cuda=pb.CudaBackendConfig(explicit_target=pb.ProcessTarget(pids=[10, 11]))
    )
    found_by_the_agent = cuda_config()
    assert found_by_the_agent.cuda is not None
    assert found_by_the_agent.cuda.explicit_target is None
    for pids in ([], [0], [-3], [True], [2**31], ["12"]):
        with pytest.raises(InvalidArgumentError, match="process id"):
            cuda_config(pids)  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (None, pb.SuspendMode.UNSPECIFIED),
        ("offload", pb.SuspendMode.OFFLOAD),
        ("DISCARD", pb.SuspendMode.DISCARD),
        ("SUSPEND_MODE_DISCARD", pb.SuspendMode.DISCARD),
        (2, pb.SuspendMode.DISCARD),
        (pb.SuspendMode.OFFLOAD, pb.SuspendMode.OFFLOAD),
    ],
)
def test_app_channel_config(mode: str | int | None, expected: pb.SuspendMode) -> None:
    config = app_channel_config(mode, ["weights", "kv_cache"])
    assert config == pb.BackendConfig(
        app_channel=pb.AppChannelConfig(mode=expected, tags=["weights", "kv_cache"])
    )
    assert app_channel_config().app_channel == pb.AppChannelConfig()


def test_app_endpoint_config() -> None:
    assert app_endpoint_config("vllm", ["http://localhost:8000"], "offload") == pb.BackendConfig(
        app_endpoint=pb.AppEndpointConfig(
            app=pb.App.VLLM,
            endpoints=["http://localhost:8000"],
            mode=pb.SuspendMode.OFFLOAD,
        )
    )
    sglang = app_endpoint_config("APP_SGLANG", ("http://a", "http://b"), tags=["weights"])
    assert sglang.app_endpoint is not None and sglang.app_endpoint.app == pb.App.SGLANG
    assert sglang.app_endpoint.tags == ["weights"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: app_endpoint_config("triton", ["http://a"]), "unknown app"),
        (lambda: app_endpoint_config(0, ["http://a"]), "app must be one of"),
        (lambda: app_endpoint_config("vllm", "http://a"), "not one string"),
        (lambda: app_endpoint_config("vllm", []), "endpoints"),
        (lambda: app_endpoint_config("vllm", [""]), "endpoints"),
        (lambda: app_channel_config("hibernate"), "unknown suspend mode"),
        (lambda: app_channel_config(tags="weights"), "not one string"),
        (lambda: app_channel_config(tags=[""]), "tags"),
        (lambda: named_backend(""), "backend name"),
        (lambda: named_backend("noop", delay_ms=5), "must be a string"),
    ],
)
def test_bad_configurations_are_refused(make: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as raised:
        make()
    assert isinstance(raised.value, ValueError)  # as the v1alpha1 helpers raised


def test_named_backend() -> None:
    assert named_backend("noop") == pb.BackendConfig(named=pb.NamedBackendConfig(name="noop"))
    config = named_backend("app_endpoint", url="http://a", retries="3")
    assert config.named is not None
    assert config.named.options == {"url": "http://a", "retries": "3"}


# --- the blocking client -------------------------------------------------------------


async def test_the_blocking_client_keeps_the_v1alpha1_calls(fake: FakeAgent, address: str) -> None:
    fake.finish_after = 0.05
    fake.status_answer = pb.StatusResponse(
        job_statuses=[pb.JobStatus(job_id="job-1", state=pb.JobState.SAVED)]
    )

    def user_code() -> None:
        with SnapshotAgentClient(address) as client:
            assert client.endpoint == address
            started = client.snapshot("job-1", "g", cuda_config([5]), backend="cuda")
            assert started == SnapshotResponse("op-1")
            done = client.wait_for_operation(started.operation_id, 0.01)
            assert done.status == "OPERATION_STATUS_COMPLETE"
            assert client.get_operation("op-1") == done
            restored = client.restore_and_wait("job-1", "g", 0.01, backend="CUDA")
            assert restored.status == "OPERATION_STATUS_COMPLETE"
            snapped = client.snapshot_and_wait("job-1", "g", 0.01, named_backend("noop"))
            assert snapped.kind == "snapshot"
            assert client.restore("job-1", "g", backend=1) == RestoreResponse("op-4")
            assert client.status().job_statuses == [JobStatus("job-1", "JOB_STATE_SAVED")]
            assert client.check_health() == HealthResponse("SERVING")
            assert client.reset_job("job-1", "g").state == "JOB_STATE_IDLE"
        with pytest.raises(RuntimeError, match="closed"):
            client.status()
        client.close()

    await asyncio.to_thread(user_code)
    assert fake.calls["snapshot"][0].backend_config == cuda_config([5])
    assert [r.backend for r in fake.calls["restore"]] == [pb.Backend.CUDA] * 2


async def test_the_blocking_client_raises_the_same_exceptions(
    fake: FakeAgent, address: str
) -> None:
    fake.finish_after = 0.01
    fake.finish_error = "boom"
    fake.fail_next["restore"] = [Status.FAILED_PRECONDITION]
    fake.operations["stuck"] = pb.GetOperationResponse(status=PENDING)

    def user_code() -> None:
        with SnapshotAgentClient(endpoint=address) as client:
            # As the v1alpha1 client did, a failed operation is answered, not raised.
            failed = client.snapshot_and_wait("job-1", poll_interval_sec=0.01)
            assert failed.status == "OPERATION_STATUS_FAILED"
            assert failed.error is not None and "boom" in failed.error
            with pytest.raises(ConflictError, match="injected"):
                client.restore("job-1")
            with pytest.raises(SnapshotAgentError):  # the v1alpha1 name still catches
                client.get_operation("nope")
            with pytest.raises(DeadlineExceededError):
                client.wait_for_operation("stuck", timeout_sec=0.1)

    await asyncio.to_thread(user_code)


def test_the_blocking_client_refuses_a_channel_and_bad_endpoints() -> None:
    with pytest.raises(InvalidArgumentError, match="endpoint"):
        SnapshotAgentClient(channel=object())
    with pytest.raises(InvalidArgumentError, match="host:port"):
        SnapshotAgentClient("nohost")


def test_the_blocking_client_stops_its_thread() -> None:
    client = SnapshotAgentClient()
    assert client.endpoint == DEFAULT_ENDPOINT
    thread = client._runner.thread
    assert thread.is_alive() and thread.daemon
    client.close()
    client.close()
    assert not thread.is_alive()
