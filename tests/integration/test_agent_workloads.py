"""Host-memory workloads in processes of their own, moved out of memory and back by
an Agent over real gRPC.

Each workload is `tests/workloads/hostmem_worker.py`: N MiB of seeded random
bytes in a `HostMemoryWorkload`, registered with the agent through
`register_workload_in_thread`. The test drives the agent with the generated
stub and asks the worker, over its stdin, for its resident memory and for a
byte-by-byte check against the seed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from agent_wire import (
    APP_CHANNEL,
    JobState,
    MiB,
    OpStatus,
    agent_stubs,
    app_channel,
    grpc_error,
    jobs,
    restore,
    run_operation,
    snapshot,
    states,
    workload_channel_raw,
)
from grpclib.const import Status

from timeslice.agent.server import Agent
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.cli_views import agent_status_json, agent_status_lines
from timeslice.client import register_workload
from timeslice.client.agent import AsyncSnapshotAgentClient, OperationFailedError
from tests.workloads.worker_process import hostmem_worker
from timeslice.client.agent_types import app_channel_config
from timeslice.workloads import HostMemoryWorkload

pytestmark = pytest.mark.timeout(90)

Stub = pb.SnapshotAgentServiceStub


@pytest.fixture
async def stub(agent: Agent) -> AsyncIterator[Stub]:
    async with agent_stubs(agent.address) as stubs:
        yield stubs.agent


def stored_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


@pytest.mark.slow
async def test_512_MiB_leave_the_process_on_snapshot_and_come_back_byte_exact(
    agent: Agent, stub: Stub, tmp_path: Path
) -> None:
    size = 512 * MiB
    async with hostmem_worker(agent.address, "big", "g", 512, 7, tmp_path) as worker:
        assert worker.info["bytes"] == size
        assert await states(stub) == {"big": JobState.RUNNING}
        before = await worker.rss()
        assert before >= size

        done = await run_operation(stub, snapshot("big", "g", APP_CHANNEL), timeout=60)
        assert done.status == OpStatus.COMPLETE, done
        assert (done.kind, done.backend) == ("snapshot", "app_channel")
        assert done.storage_bytes is not None and done.storage_bytes >= size
        assert done.snapshot_device_bytes is not None and done.snapshot_device_bytes >= size
        status = (await jobs(stub))["big"]
        assert (status.state, status.fault) == (JobState.SAVED, "")
        freed = before - await worker.rss()
        assert freed >= 0.9 * size, f"only {freed / MiB:.0f} MiB of the process's memory freed"
        assert stored_bytes(tmp_path / "store-big") == size
        assert (await worker.ask("state"))["state"] == "SAVED"

        back = await run_operation(stub, restore("big", "g"), timeout=60)
        assert back.status == OpStatus.COMPLETE, back
        assert (back.kind, back.error) == ("restore", None)
        assert await states(stub) == {"big": JobState.RUNNING}
        assert await worker.verify() == {"ok": True, "mismatched": []}
        assert await worker.rss() >= size
        assert stored_bytes(tmp_path / "store-big") == 0


@pytest.mark.slow
async def test_two_workloads_alternate_through_100_snapshot_restore_cycles(
    agent: Agent, stub: Stub, tmp_path: Path
) -> None:
    size, cycles = 32 * MiB, 100
    async with (
        hostmem_worker(agent.address, "a", "g", 32, 1, tmp_path) as a,
        hostmem_worker(agent.address, "b", "g", 32, 2, tmp_path) as b,
    ):
        assert await states(stub) == {"a": JobState.RUNNING, "b": JobState.RUNNING}
        first = await run_operation(stub, snapshot("b", "g", APP_CHANNEL))
        assert first.status == OpStatus.COMPLETE
        expected = {"a": JobState.RUNNING, "b": JobState.SAVED}
        assert await states(stub) == expected

        running, saved = "a", "b"
        for cycle in range(cycles):
            out = await run_operation(stub, snapshot(running, "g"))
            assert (out.status, out.storage_bytes, out.error) == (OpStatus.COMPLETE, size, None), (
                cycle, out,
            )  # fmt: skip
            expected[running] = JobState.SAVED
            assert await states(stub) == expected, cycle
            back = await run_operation(stub, restore(saved, "g"))
            assert (back.status, back.error) == (OpStatus.COMPLETE, None), (cycle, back)
            expected[saved] = JobState.RUNNING
            assert await states(stub) == expected, cycle
            running, saved = saved, running

        assert (running, saved) == ("a", "b")
        assert all(not j.fault for j in (await jobs(stub)).values())
        assert (await a.ask("state"))["state"] == "RUNNING"
        assert (await b.ask("state"))["state"] == "SAVED"
        assert await a.verify() == {"ok": True, "mismatched": []}
        assert (await run_operation(stub, restore("b", "g"))).status == OpStatus.COMPLETE
        assert await b.verify() == {"ok": True, "mismatched": []}


async def test_tags_and_modes_reach_the_workload(agent: Agent, stub: Stub, tmp_path: Path) -> None:
    size = 16 * MiB
    async with hostmem_worker(agent.address, "w", "g", 16, 3, tmp_path) as worker:
        # Only the KV cache (a quarter of the bytes) is offloaded.
        kv = app_channel(pb.SuspendMode.OFFLOAD, "kv_cache")
        out = await run_operation(stub, snapshot("w", "g", kv))
        assert (out.status, out.storage_bytes) == (OpStatus.COMPLETE, size // 4)
        assert (await worker.ask("state"))["saved"] == ["kv_cache"]
        assert await states(stub) == {"w": JobState.SAVED}
        back = await run_operation(stub, restore("w", "g"))
        assert back.status == OpStatus.COMPLETE
        assert await worker.verify() == {"ok": True, "mismatched": []}

        # Discarded weights come back zero-filled, for the application to provide again.
        weights = app_channel(pb.SuspendMode.DISCARD, "weights")
        out = await run_operation(stub, snapshot("w", "g", weights))
        assert (out.status, out.storage_bytes, out.snapshot_device_bytes) == (
            OpStatus.COMPLETE, 0, size // 2,
        )  # fmt: skip
        back = await run_operation(stub, restore("w", "g"))
        assert back.status == OpStatus.COMPLETE
        assert await worker.verify() == {"ok": False, "needs_provision": ["weights"]}
        assert await states(stub) == {"w": JobState.RUNNING}

        # A tag the workload does not have fails the operation, and says why.
        out = await run_operation(stub, snapshot("w", "g", app_channel(pb.SuspendMode.OFFLOAD,
                                                                       "no-such-tag")))  # fmt: skip
        assert out.status == OpStatus.FAILED
        assert "no-such-tag" in (out.error or "")


async def test_the_agent_client_moves_a_workload_out_and_back(
    agent: Agent, stub: Stub, tmp_path: Path
) -> None:
    size = 16 * MiB
    async with (
        hostmem_worker(agent.address, "c", "g", 16, 4, tmp_path) as worker,
        AsyncSnapshotAgentClient(agent.address, call_timeout_sec=10) as client,
    ):
        saved = await client.snapshot_and_wait(
            "c", "g", backend_config=app_channel_config(), timeout_sec=30
        )
        assert (saved.status, saved.kind, saved.storage_bytes) == (
            "OPERATION_STATUS_COMPLETE", "snapshot", size,
        )  # fmt: skip
        status = await client.status()
        assert status.node_name == "n1"
        assert [(j.job_id, j.state) for j in status.job_statuses] == [("c", "JOB_STATE_SAVED")]
        assert (await worker.ask("state"))["state"] == "SAVED"

        back = await client.restore_and_wait("c", "g", timeout_sec=30)
        assert back.status == "OPERATION_STATUS_COMPLETE"
        assert await worker.verify() == {"ok": True, "mismatched": []}

        # A failed operation raises, with the operation's own account of why.
        with pytest.raises(OperationFailedError) as failed:
            await client.snapshot_and_wait(
                "c", "g", backend_config=app_channel_config(tags=["no-such-tag"]), timeout_sec=30
            )
        assert failed.value.response is not None
        assert "no-such-tag" in (failed.value.response.error or "")
        assert (await jobs(stub))["c"].state == JobState.FAULTED
        assert (await client.reset_job("c", "g")).state == "JOB_STATE_RUNNING"
        assert await worker.verify() == {"ok": True, "mismatched": []}


async def test_the_agent_status_says_where_each_workload_keeps_its_context(
    agent: Agent, tmp_path: Path
) -> None:
    in_memory, in_files = HostMemoryWorkload(), HostMemoryWorkload(tmp_path / "files")
    for one in (in_memory, in_files):
        one.add("w", np.arange(1000, dtype=np.float32))
    quiet = {"on_snapshot": lambda mode, tags: None, "on_restore": lambda tags: None}
    async with (
        await register_workload(agent.address, "m", "g", workload=in_memory),
        await register_workload(agent.address, "f", "g", workload=in_files),
        await register_workload(agent.address, "q", "g", **quiet),
        AsyncSnapshotAgentClient(agent.address, call_timeout_sec=10) as client,
    ):
        saved = await client.snapshot_and_wait("m", "g", backend_config=app_channel_config())
        assert saved.storage_bytes == 4000
        answer = await client.status()
        stores = {j.job_id: j.store for j in answer.job_statuses}
        assert stores == {"m": "memory", "f": "file", "q": ""}
        lines = agent_status_lines(agent.address, answer)
        assert any("job g/m: SAVED" in line and "store=memory" in line for line in lines)
        assert any("job g/f: RUNNING" in line and "store=file" in line for line in lines)
        assert not any("job g/q" in line and "store=" in line for line in lines)
        shown = {j["job"]: j["store"] for j in agent_status_json(agent.address, answer)["jobs"]}
        assert shown == {"m": "memory", "f": "file", "q": None}
    in_memory.close()
    in_files.close()


async def test_a_store_name_longer_than_64_bytes_is_refused(agent: Agent, stub: Stub) -> None:
    capabilities = pb.WorkloadCapabilities(store="m" * 65)
    register = pb.RegisterWorkload(job_id="w", group="g", capabilities=capabilities)
    message = pb.WorkloadMessage(register=register)
    error = await grpc_error(workload_channel_raw(agent.address, [bytes(message)]))
    assert error.status == Status.INVALID_ARGUMENT
    assert "store is at most 64 bytes" in (error.message or "")
    assert await jobs(stub) == {}
