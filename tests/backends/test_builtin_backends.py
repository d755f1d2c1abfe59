"""The conformance suite for the backends that need nothing outside the process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.backends.conformance import BackendConformance
from timeslice.agent.channels import Capabilities, Result, WorkloadChannel, WorkloadChannels
from timeslice.backends import BackendContext, JobRef
from timeslice.backends.app_channel import AppChannelBackend
from timeslice.backends.noop import NoopBackend


class TestNoop(BackendConformance):
    @pytest.fixture
    def backend(self) -> NoopBackend:
        return NoopBackend(BackendContext("n1", WorkloadChannels()))

    @pytest.fixture
    def job(self) -> JobRef:
        return JobRef("g", "j")

    @pytest.fixture
    def bad_job(self) -> JobRef:
        return JobRef("g", "j", {"unexpected": 1})


class FakeWorkload:
    """Answers a channel's commands as a workload would, keeping its own state."""

    def __init__(self, channel: WorkloadChannel) -> None:
        self.channel = channel
        self.state = "RUNNING"
        self.commands: list[str] = []

    async def serve(self) -> None:
        while (command := await self.channel.outbox.get()) is not None:
            self.commands.append(f"{command.kind}:{command.mode}")
            self.state = "SAVED" if command.kind == "snapshot" else "RUNNING"
            self.channel.deliver(
                Result(command.command_id, True, storage_bytes=10, device_bytes=10)
            )


class TestAppChannel(BackendConformance):
    @pytest.fixture
    async def workload(self) -> AsyncIterator[FakeWorkload]:
        channels = WorkloadChannels()
        channel = WorkloadChannel("g", "j", Capabilities())
        channels.attach(channel)
        workload = FakeWorkload(channel)
        task = asyncio.ensure_future(workload.serve())
        yield workload
        channel.close("test over")
        await task

    @pytest.fixture
    def backend(self, workload: FakeWorkload) -> AppChannelBackend:
        channels = WorkloadChannels()
        channels.attach(workload.channel)
        return AppChannelBackend(BackendContext("n1", channels))

    @pytest.fixture
    def job(self) -> JobRef:
        return JobRef("g", "j")

    @pytest.fixture
    def bad_job(self) -> JobRef:
        return JobRef("g", "nobody")

    @pytest.fixture(autouse=True)
    def _keep(self, workload: FakeWorkload) -> None:
        self.workload = workload

    async def assert_saved(self, job: JobRef) -> None:
        assert self.workload.state == "SAVED"

    async def assert_running(self, job: JobRef) -> None:
        assert self.workload.state == "RUNNING"

    async def test_the_mode_comes_from_the_registration(self, backend: AppChannelBackend) -> None:
        await backend.snapshot(JobRef("g", "j"), {})
        await backend.restore(JobRef("g", "j"), {})
        await backend.snapshot(JobRef("g", "j"), {"mode": "discard"})
        assert self.workload.commands == ["snapshot:offload", "restore:", "snapshot:discard"]
