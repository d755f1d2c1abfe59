"""The v1alpha1 client's call forms on our clients, against a real Agent:
`register_workload` called from plain code or from a coroutine, awaited or not,
and the agent client's positional arguments in the v1alpha1 order.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from tests.waiting import until
from timeslice import Agent
from timeslice.client import (
    AsyncSnapshotAgentClient,
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    WorkloadHandle,
    WorkloadRegistration,
    app_channel_config,
    register_workload,
)
from timeslice.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(60)


class Workload:
    """Records what the agent asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.thread_names: set[str] = set()

    def snapshot(self, mode: str, tags: list[str]) -> None:
        self.calls.append(("snapshot", mode, *tags))
        self.thread_names.add(threading.current_thread().name)

    def restore(self, tags: list[str]) -> None:
        self.calls.append(("restore", *tags))


async def test_from_plain_code_it_returns_a_handle_once_registered(agent: Agent) -> None:
    workload = Workload()

    def user_code() -> WorkloadHandle:
        handle = register_workload(agent.address, "j", "g1", workload)
        assert isinstance(handle, WorkloadHandle) and handle.connected
        with SnapshotAgentClient(agent.address) as client:
            done = client.snapshot_and_wait("j", poll_interval_sec=0.01)
            assert done.status == "OPERATION_STATUS_COMPLETE"
        return handle

    handle = await asyncio.to_thread(user_code)
    assert workload.calls == [("snapshot", "offload")]
    assert agent.table.jobs[("g1", "j")].state.value == "SAVED"
    with pytest.raises(RuntimeError, match="thread of its own"):
        await handle
    await asyncio.to_thread(handle.close, 5.0)
    assert handle.closed and not handle.connected
    await until(lambda: ("g1", "j") not in agent.table.jobs, "the workload deregistered")
    await asyncio.to_thread(handle.close)  # idempotent


async def test_where_a_loop_runs_it_registers_even_unawaited(agent: Agent) -> None:
    workload = Workload()
    handle = register_workload(agent.address, "j", workload=workload)  # as v1alpha1 code does
    assert isinstance(handle, WorkloadHandle)
    await until(lambda: ("", "j") in agent.table.jobs, "the workload registered")
    assert handle.connected
    async with AsyncSnapshotAgentClient(agent.address) as client:
        await client.snapshot_and_wait("j", timeout_sec=5)
    assert workload.calls == [("snapshot", "offload")]
    handle.close()  # on the loop's own thread: the close starts, and goes on
    await until(lambda: ("", "j") not in agent.table.jobs, "the workload deregistered")
    assert handle.closed


async def test_awaited_it_gives_the_registration(agent: Agent) -> None:
    registration = await register_workload(agent.address, "a", "g", Workload())
    assert isinstance(registration, WorkloadRegistration) and registration.connected
    handle = register_workload(agent.address, "b", "g", Workload())
    assert await handle is handle.registration
    in_task = await asyncio.create_task(register_workload(agent.address, "c", "g", Workload()))
    in_wait = await asyncio.wait_for(register_workload(agent.address, "d", "g", Workload()), 5)
    assert {k for k in agent.table.jobs} == {("g", j) for j in "abcd"}
    for each in (registration, handle.registration, in_task, in_wait):
        await each.close()
    await until(lambda: not agent.table.jobs, "every workload deregistered")


async def test_an_unawaited_registration_that_fails_says_so(
    free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "timeslice.client.workload")
    handle = register_workload(
        f"127.0.0.1:{free_port}", "j", workload=Workload(), connect_timeout_sec=0.2
    )
    await until(lambda: handle.closed, "the registration gave up", timeout=10)
    await until(lambda: "was not registered" in caplog.text, "the failure logged")
    assert "job j" in caplog.text and str(free_port) in caplog.text


async def test_the_agent_client_takes_the_v1alpha1_positional_arguments(agent: Agent) -> None:
    workload = Workload()
    registration = await register_workload(agent.address, "j", "g", workload)
    async with AsyncSnapshotAgentClient(agent.address) as client:
        config = app_channel_config("discard", ["weights"])
        started = await client.snapshot("j", "g", config)  # (job_id, group, backend_config)
        await client.wait_for_operation(started.operation_id, 0.01, timeout_sec=5)
        await client.restore_and_wait("j", "g", 0.01)  # (job_id, group, poll_interval_sec)
        await client.snapshot_and_wait("j", "g", 0.01, app_channel_config("offload"))
        # What used to be the third argument, the deprecated enum, is keyword-only now:
        # given in its old place it is refused, naming backend=.
        with pytest.raises(InvalidArgumentError, match="backend="):
            await client.snapshot("j", "g", "cuda")  # type: ignore[arg-type]
    assert workload.calls[:3] == [
        ("snapshot", "discard", "weights"),
        ("restore",),
        ("snapshot", "offload"),
    ]
    await registration.close()


def test_grpcio_channel_options_are_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture, free_port: int
) -> None:
    options = [("grpc.service_config", "{}"), ("grpc.enable_retries", 1)]
    with caplog.at_level(logging.WARNING, "timeslice.client"):
        client = TimeSliceOrchestratorClient(f"127.0.0.1:{free_port}", channel_options=options)
        client.close()
    assert "ignores channel_options" in caplog.text
    assert "grpc.service_config, grpc.enable_retries" in caplog.text
