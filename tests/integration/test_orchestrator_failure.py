"""A journal write that fails stops the orchestrator (fail-stop): nothing that was
not made durable is ever acted on, and the next start serves what the journal holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError
from orchestrator_wire import grpc_status, orchestrator_stub, status_of

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.orchestrator.server import Orchestrator


async def test_a_failed_journal_write_stops_the_orchestrator_and_acts_on_nothing(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'journal.db'}"
    async with Orchestrator(db=db) as orch, orchestrator_stub(orch.address) as stub:
        await stub.acquire(pb.AcquireRequest(job_id="a", group_id="g"))
        waiter = asyncio.ensure_future(stub.acquire(pb.AcquireRequest(job_id="b", group_id="g")))
        while (await status_of(stub, "g")).waiter_queue_depth < 1:
            await asyncio.sleep(0.01)

        async def broken_append(events: object) -> int:
            raise OSError("disk full")

        orch._journal.append = broken_append  # type: ignore[union-attr, method-assign]
        assert await grpc_status(stub.yield_(pb.YieldRequest(job_id="a", group_id="g"))) == (
            Status.UNAVAILABLE
        )
        # b was never told it holds the lock: the handoff was not durable.
        assert await grpc_status(waiter) == Status.UNAVAILABLE
        await asyncio.wait_for(orch.wait_stopped(), 5)
        assert isinstance(orch.failure, OSError)
        with pytest.raises((StreamTerminatedError, ConnectionError)):
            await stub.list_groups(pb.ListGroupsRequest())

    async with Orchestrator(db=db) as again, orchestrator_stub(again.address) as stub:
        status = await status_of(stub, "g")
        assert (status.locking_job, list(status.waiting_jobs), status.fencing_token) == (
            "a",
            ["b"],
            1,
        )


@pytest.mark.parametrize("db", [None, "sqlite"])
async def test_close_ends_the_connections_of_clients(tmp_path: Path, db: str | None) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}" if db else None
    orch = Orchestrator(db=url)
    await orch.start()
    async with orchestrator_stub(orch.address) as stub:
        await stub.list_groups(pb.ListGroupsRequest())
        await orch.close()
        await asyncio.wait_for(orch.wait_stopped(), 5)
        # The connection is gone, not left open to a server that no longer serves: the
        # call fails on the transport (a client reconnects to whatever serves next).
        with pytest.raises((StreamTerminatedError, ConnectionError)):
            await stub.list_groups(pb.ListGroupsRequest())
