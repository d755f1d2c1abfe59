"""An agent refuses a command of a deposed active orchestrator
(TIMESLICE_TEST_POSTGRES_URL): active A switches a group on the agent's node,
A's renewals are held off (as if frozen) and its lease expires, standby B takes
over with a higher epoch and switches the group; then A's own switch, and the
switch A would send with a valid proof of its epoch, are refused and move
nothing, also after the agent restarts (the epoch was saved with its table).

The agent reaches "the orchestrator" through a forwarder the test points at the
active, as a Kubernetes Service would route to the one that is SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.waiting import until
from timeslice import Agent, AsyncSnapshotAgentClient, AsyncTimeSliceOrchestratorClient
from timeslice.agent.state import JobState
from timeslice.client.workload import register_workload
from timeslice.errors import ConflictError
from timeslice.fencing import token_proof
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.journal import SqlJournal
from timeslice.orchestrator.server import Orchestrator
from timeslice.workloads import HostMemoryWorkload

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set"),
]
LEASE = 0.6


class Forwarder:
    """A TCP forwarder on 127.0.0.1 to one orchestrator at a time; pointing it
    elsewhere closes every connection through it, so that clients reconnect."""

    def __init__(self) -> None:
        self.target = ""
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    def point(self, target: str) -> None:
        self.target = target
        for writer in list(self._writers):
            writer.close()

    async def close(self) -> None:
        self.point("")
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = self.target.rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except (OSError, ValueError):
            writer.close()
            return
        for w in (writer, up_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._writers.add(w)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def expire_lease(url: str) -> None:
    """End the active's lease now, on the database's clock."""
    engine = create_async_engine(SqlJournal(url).url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("UPDATE leader_lease SET expires_at = '-infinity'"))
    finally:
        await engine.dispose()


def hold_off_renewals(orch: Orchestrator) -> None:
    """Stop the active's lease renewals without it noticing, as if it were frozen."""
    lease = orch._journal._lease if isinstance(orch._journal, SqlJournal) else None
    assert lease is not None and lease._task is not None
    lease._task.cancel()


def memory(store: Path, seed: int) -> tuple[HostMemoryWorkload, np.ndarray[Any, Any]]:
    workload = HostMemoryWorkload(store)
    data = np.random.default_rng(seed).integers(0, 256, 256 * 1024, dtype=np.uint8)
    workload.add("weights", data.copy(), tags=("weights",))
    return workload, data


async def hold_once(address: str, job: str) -> int:
    """`job` acquires group "g" and yields it; its grant's fencing token."""
    async with AsyncTimeSliceOrchestratorClient(address, job, "g") as client:
        grant = await client.acquire(timeout_sec=10)
        await client.release()
        return grant.fencing_token


def states(agent: Agent) -> dict[str, JobState]:
    return {job.job: job.state for job in agent.table.jobs.values()}


async def test_an_agent_refuses_a_command_of_a_deposed_active(
    database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="timeslice.orchestrator.handoff")
    forwarder = Forwarder()
    await forwarder.start()
    options: dict[str, Any] = {"db": database, "leader_lease": LEASE, "group_nodes": {"g": ("n1",)}}
    a, b = Orchestrator(**options), Orchestrator(**options)
    agent_db = f"sqlite:///{tmp_path / 'agent.db'}"
    x, x_data = memory(tmp_path / "x", 1)
    y, y_data = memory(tmp_path / "y", 2)
    agent = agent2 = None
    registrations = []
    try:
        await a.start()
        forwarder.point(a.address)
        agent = Agent(
            node_name="n1", backends=("app_channel",), orchestrator=forwarder.address, db=agent_db
        )
        await agent.start()
        for job, workload in (("x", x), ("y", y)):
            registrations.append(
                await register_workload(agent.address, job, "g", workload, connect_timeout_sec=5)
            )
        await until(lambda: len(agent.table.jobs) == 2 and a.agents.token_key("n1"), "in session")

        # A switches the group to x on the agent: y's context goes to host memory.
        await hold_once(a.address, "x")
        assert states(agent) == {"x": JobState.RUNNING, "y": JobState.SAVED}
        a_epoch = a.table.epoch
        assert a_epoch > 0 and agent.table.orchestrator_epoch == a_epoch

        # A is deposed: its renewals held off, its lease expires, B takes over.
        hold_off_renewals(a)
        await expire_lease(database)
        await asyncio.wait_for(b.start(), LEASE + 5)
        assert b.table.epoch > a_epoch
        forwarder.point(b.address)  # the agent's session follows the active
        await until(lambda: b.agents.token_key("n1"), "the agent in session with B")

        # B switches the group to y: x's context out, y's back.
        y_token = await hold_once(b.address, "y")
        assert states(agent) == {"x": JobState.SAVED, "y": JobState.RUNNING}
        assert agent.table.orchestrator_epoch == b.table.epoch
        assert np.array_equal(y["weights"], y_data)
        operations = len(agent.table.operations)

        # A's switch driver, as A's switch in flight would go on when A wakes (A has
        # stopped meanwhile: B's takeover ended its journal's session): refused,
        # nothing crashes, the log line says why.
        a.handoff.start(ev.SwitchStarted(group="g", job="x", token=y_token, previous="y"))
        running = a.handoff._running.get("g")
        assert running is not None
        await asyncio.wait_for(asyncio.shield(running[1]), 10)
        assert running[1].exception() is None
        await a.handoff.close()  # its client of the agent, made after A closed
        refused = f"a command of orchestrator epoch {a_epoch}, but epoch {b.table.epoch}"
        assert any(refused in r.getMessage() for r in caplog.records), caplog.text

        # The switch A would send, with a valid proof of its epoch and the newest
        # token the group has seen: refused, as only its epoch is stale.
        async with AsyncSnapshotAgentClient(agent.address) as client:
            proof = token_proof(agent._link.token_key, "g", y_token, epoch=a_epoch)
            with pytest.raises(ConflictError, match=f"^{refused} has taken over: refused$"):
                await client.switch_group(
                    "g", "x", y_token, timeout_sec=5, token_proof=proof, orchestrator_epoch=a_epoch
                )
        assert states(agent) == {"x": JobState.SAVED, "y": JobState.RUNNING}
        assert len(agent.table.operations) == operations
        assert np.array_equal(y["weights"], y_data) and x.state == "SAVED"

        # After its restart the agent still refuses A's epoch: it was saved.
        for registration in registrations:
            await registration.close()
        registrations = []
        await agent.close()
        agent2 = Agent(
            node_name="n1", backends=("app_channel",), orchestrator=forwarder.address, db=agent_db
        )
        await agent2.start()
        assert agent2.table.orchestrator_epoch == b.table.epoch
        await until(lambda: agent2._link is not None and b.agents.token_key("n1"), "session")
        operations = len(agent2.table.operations)
        async with AsyncSnapshotAgentClient(agent2.address) as client:
            assert agent2._link is not None
            proof = token_proof(agent2._link.token_key, "g", y_token, epoch=a_epoch)
            with pytest.raises(ConflictError, match=refused):
                await client.switch_group(
                    "g", "x", y_token, timeout_sec=5, token_proof=proof, orchestrator_epoch=a_epoch
                )
        assert len(agent2.table.operations) == operations
        assert agent2.table.orchestrator_epoch == b.table.epoch
    finally:
        for registration in registrations:
            await registration.close()
        for running in (agent, agent2):
            if running is not None:
                await running.close()
        await a.close()
        await b.close()
        await forwarder.close()
