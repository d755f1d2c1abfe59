"""A journal write that fails stops the orchestrator (fail-stop): nothing that was
not made durable is ever acted on, and the next start serves what the journal holds.
A journal another writer holds is waited for, and only what must be written waits."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError
from orchestrator_wire import grpc_status, orchestrator_stub, status_of

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.orchestrator import journal
from timeslice.orchestrator.server import Orchestrator


async def test_a_failed_journal_write_stops_the_orchestrator_and_acts_on_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'journal.db'}"
    async with Orchestrator(db=db) as orch, orchestrator_stub(orch.address) as stub:
        await stub.acquire(pb.AcquireRequest(job_id="a", group_id="g"))
        waiter = asyncio.ensure_future(stub.acquire(pb.AcquireRequest(job_id="b", group_id="g")))
        while (await status_of(stub, "g")).waiter_queue_depth < 1:
            await asyncio.sleep(0.01)

        def broken_append(dbapi_connection: object, rows: object) -> None:
            raise OSError("disk full")

        # Under the journal's own code, which the engine calls on the loop's thread.
        monkeypatch.setattr(journal, "_append_sqlite", broken_append)
        assert await grpc_status(stub.yield_(pb.YieldRequest(job_id="a", group_id="g"))) == (
            Status.UNAVAILABLE
        )
        # b was never told it holds the lock: the handoff was not durable.
        assert await grpc_status(waiter) == Status.UNAVAILABLE
        await asyncio.wait_for(orch.wait_stopped(), 5)
        assert isinstance(orch.failure, OSError)
        with pytest.raises((StreamTerminatedError, ConnectionError)):
            await stub.list_groups(pb.ListGroupsRequest())

    monkeypatch.undo()  # the disk has room again
    async with Orchestrator(db=db) as again, orchestrator_stub(again.address) as stub:
        status = await status_of(stub, "g")
        assert (status.locking_job, list(status.waiting_jobs), status.fencing_token) == (
            "a",
            ["b"],
            1,
        )


async def test_a_journal_another_writer_holds_holds_up_only_the_decisions_to_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    async with Orchestrator(db=f"sqlite:///{path}") as orch:
        await orch.acquire("g", "a")
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            yielded = asyncio.ensure_future(orch.yield_("g", "a"))
            started = time.monotonic()
            await asyncio.sleep(0.2)  # the loop is not stuck in the write
            assert time.monotonic() - started < 1
            assert not yielded.done()  # a yield is answered once it is durable
            other.execute("ROLLBACK")
            await asyncio.wait_for(yielded, 5)
            assert orch.failure is None
            await orch.acquire("g", "b")  # and inline writes go on
        finally:
            other.close()
    async with Orchestrator(db=f"sqlite:///{path}") as again:
        holder = again.table.groups["g"].holder
        assert holder is not None and holder.job == "b"


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
