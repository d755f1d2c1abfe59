"""Our client against a server that speaks only the v1alpha1 protocol: what it
cannot do there fails loudly, and its timeouts hold.

The server is `FakeV1alpha1Orchestrator` (grpcio and the official protobuf
runtime, from the v1alpha1 .proto), which ignores every field we add: the more
groups of an Acquire and its wait limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.grpcio_compat import compiled
from tests.v1alpha1.fake_orchestrator import FakeV1alpha1Orchestrator
from timeslice.client import AsyncTimeSliceOrchestratorClient, TimeSliceOrchestratorClient
from timeslice.errors import DeadlineExceededError, NotHolderError, UnimplementedError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def v1alpha1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    with compiled(["v1alpha1_orchestrator.proto"], tmp_path_factory.mktemp("gen")) as modules:
        yield modules["v1alpha1_orchestrator_pb2"], modules["v1alpha1_orchestrator_pb2_grpc"]


@pytest.fixture
def server(v1alpha1: tuple[ModuleType, ModuleType]) -> Iterator[FakeV1alpha1Orchestrator]:
    fake = FakeV1alpha1Orchestrator(*v1alpha1)
    yield fake
    fake.stop()


async def test_acquire_groups_fails_loudly_and_gives_back_the_one_group_granted(
    server: FakeV1alpha1Orchestrator,
) -> None:
    async with AsyncTimeSliceOrchestratorClient(server.address, job_id="j") as client:
        with pytest.raises(UnimplementedError, match="several groups at once") as raised:
            await client.acquire_groups(["samplers", "trainers"], timeout_sec=5)
        assert "released again" in raised.value.message
        with pytest.raises(UnimplementedError):
            async with client.acquire_groups(["samplers", "trainers"]):
                raise AssertionError("the block ran holding one group of two")
        # One group alone is what a v1alpha1 server does grant.
        async with client.acquire(group_id="samplers") as result:
            assert result.success and server.holders == {"samplers": "j"}
    assert server.holders == {}
    assert server.calls[:3] == [
        ("acquire", "j", "samplers"),
        ("granted", "j", "samplers"),
        ("yield", "j", "samplers"),
    ]
    assert not any(group == "trainers" for _, _, group in server.calls)


@pytest.mark.parametrize("limit", [0.3, 1.0])
async def test_an_acquire_gives_up_at_about_its_timeout(
    server: FakeV1alpha1Orchestrator, limit: float
) -> None:
    server.hold("g", "holder")
    async with AsyncTimeSliceOrchestratorClient(server.address, "j", "g") as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            await client.acquire(timeout_sec=limit)
        took = time.monotonic() - started
    assert limit <= took < limit + 0.4, took
    # The server saw the caller leave, and granted it nothing.
    for _ in range(100):
        if ("left", "j", "g") in server.calls:
            break
        await asyncio.sleep(0.02)
    assert server.calls == [("acquire", "j", "g"), ("left", "j", "g")]
    assert server.holders == {"g": "holder"}


def test_the_blocking_client_keeps_the_timeout_and_refuses_the_bundle(
    server: FakeV1alpha1Orchestrator,
) -> None:
    server.hold("g", "holder")
    with TimeSliceOrchestratorClient(server.address, "j", "g") as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            client.acquire(timeout_sec=1.0)
        assert 1.0 <= time.monotonic() - started < 1.4
        with pytest.raises(UnimplementedError, match="several groups at once"):
            client.acquire_groups(["a", "b"])
        assert "a" not in server.holders
        # A Yield by a job that does not hold the lock: PERMISSION_DENIED there.
        with pytest.raises(NotHolderError) as refused:
            client.release()
        assert refused.value.code.name == "PERMISSION_DENIED"


def test_the_fake_server_reads_only_the_v1alpha1_fields(
    v1alpha1: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    # What makes the tests above mean something: our AcquireRequest's added fields
    # (more groups, a wait limit) are unknown to the v1alpha1 messages.
    pb2, _ = v1alpha1
    fields = set(pb2.AcquireRequest.DESCRIPTOR.fields_by_name)
    assert fields == {"job_id", "group_id"}
