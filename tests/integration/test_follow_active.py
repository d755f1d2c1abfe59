"""Clients follow the active orchestrator (TIMESLICE_TEST_POSTGRES_URL): given a
standby's address before the active's, a client and an agent reach the active; the
standby's UNAVAILABLE names the active in its trailing metadata; after a takeover
both carry on against the new active, and an Acquire queued at the old one is
granted by the new one once, under its request id."""

from __future__ import annotations

import asyncio
import os

import grpclib.client
import pytest
from grpclib.const import Status
from grpclib.events import RecvTrailingMetadata, listen
from grpclib.exceptions import GRPCError

from tests.integration.test_cli_ops import invoke
from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client._connector import Connector
from timeslice.client.orchestrator import AsyncTimeSliceOrchestratorClient
from timeslice.ids import Target
from timeslice.orchestrator.journal import SqlJournal
from timeslice.orchestrator.server import Orchestrator
from timeslice.targets import ACTIVE_KEY, LEASE_KEY, parse_targets

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set"),
]
LEASE = 0.6


async def refusal_of(address: str, key: str = ACTIVE_KEY) -> tuple[GRPCError, list[str]]:
    """A raw Acquire at `address`: the error and its trailing metadata's `key`."""
    host, _, port = address.rpartition(":")
    chan = grpclib.client.Channel(host, int(port))
    seen: list[str] = []

    async def trailers(event: RecvTrailingMetadata) -> None:
        seen.extend(str(v) for v in event.metadata.getall(key, []))

    listen(chan, RecvTrailingMetadata, trailers)
    try:
        stub = pb.TimeSliceOrchestratorServiceStub(chan, timeout=3)
        with pytest.raises(GRPCError) as refused:
            await stub.acquire(pb.AcquireRequest(group_id="g", job_id="raw", request_id="raw"))
        return refused.value, seen
    finally:
        chan.close()


async def standby_of(database: str) -> tuple[Orchestrator, asyncio.Future[None]]:
    standby = Orchestrator(db=database, leader_lease=LEASE)
    starting = asyncio.ensure_future(standby.start())  # returns once it took over
    await until(lambda: standby._address is not None, "the standby listens")
    await until(lambda: standby.active_address() is not None, "the standby reads the active")
    return standby, starting


async def test_clients_and_agents_follow_the_active_across_a_takeover(database: str) -> None:
    active = Orchestrator(db=database, leader_lease=LEASE)
    await active.start()
    standby, starting = await standby_of(database)
    targets = f"{standby.address},{active.address}"  # the standby first
    holder = AsyncTimeSliceOrchestratorClient(
        targets, "x", "g", lease_ttl_sec=30, reconnect_timeout_sec=15
    )
    waiter = AsyncTimeSliceOrchestratorClient(
        targets, "y", "g", lease_ttl_sec=30, reconnect_timeout_sec=15
    )
    agent = Agent(node_name="n1", backends=("noop",), orchestrator=targets)
    try:
        error, named = await refusal_of(standby.address)
        assert error.status is Status.UNAVAILABLE
        assert "standby" in (error.message or "")
        assert named == [active.address]
        _, lease = await refusal_of(standby.address, LEASE_KEY)
        assert lease == [str(round(LEASE * 1000))]  # how long it may name a frozen one

        # `timeslice status` over both says which is active, and shows its groups.
        code, out, err = await asyncio.to_thread(invoke, "status", "--target", targets)
        assert code == 0, err
        waiting_line, active_line, *_ = out.splitlines()
        assert waiting_line.startswith(f"orchestrator {standby.address}: standby (lease epoch 1")
        assert f"the active is {active.address}; table epoch 0)" in waiting_line
        assert active_line.startswith(f"orchestrator {active.address}: active (lease epoch 1,")

        first = await holder.acquire()
        assert active.table.groups["g"].holder is not None
        assert active.table.groups["g"].holder.job == "x"
        await holder.release()
        await agent.start()
        await until(lambda: active.agents.in_session("n1"), "the agent reaches the active")

        held = await holder.acquire()
        assert held.fencing_token > first.fencing_token
        queued = asyncio.ensure_future(waiter.acquire(timeout_sec=20))
        await until(lambda: len(active.table.groups["g"].queue) == 1, "y queued at the active")

        await active.close()  # the standby takes over, folding the journal
        await asyncio.wait_for(starting, LEASE + 3)
        assert not queued.done()
        await until(lambda: standby.agents.in_session("n1"), "the agent follows", timeout=10)
        await until(lambda: len(standby.table.groups["g"].queue) == 1, "y's place is kept")

        await holder.release()  # through the new active
        granted = await asyncio.wait_for(queued, 10)
        group = standby.table.groups["g"]
        assert group.holder is not None and group.holder.job == "y"
        assert granted.fencing_token == group.holder.token > held.fencing_token
        assert not group.queue
        await waiter.release()
        group = standby.table.groups["g"]
        assert group.holder is None and not group.queue  # granted once, queued once
    finally:
        await holder.close()
        await waiter.close()
        await agent.close()
        await active.close()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await standby.close()


async def test_a_standby_names_no_active_it_does_not_know(database: str) -> None:
    active = Orchestrator(db=database, leader_lease=LEASE, host="0.0.0.0", insecure=True)
    await active.start()
    standby = Orchestrator(db=database, leader_lease=LEASE)
    starting = asyncio.ensure_future(standby.start())
    try:
        await until(lambda: standby._address is not None, "the standby listens")
        await until(
            lambda: isinstance(standby._journal, SqlJournal)
            and standby._journal.lease is not None
            and standby._journal.lease.row is not None,
            "the standby reads the row",
        )
        error, named = await refusal_of(standby.address)
        assert error.status is Status.UNAVAILABLE
        assert named == []  # the active listens on a wildcard and advertises nothing
    finally:
        await active.close()
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await standby.close()


async def test_a_refusal_sends_the_client_to_the_active_before_other_candidates(
    database: str,
) -> None:
    active = Orchestrator(db=database, leader_lease=LEASE)
    await active.start()
    standby, starting = await standby_of(database)
    dead = Orchestrator()  # an address that refuses connections once closed
    await dead.start()
    dead_address = dead.address
    await dead.close()
    ours = Target(host="127.0.0.1", port=int(active.address.rpartition(":")[2]))
    connector = Connector(
        parse_targets(f"{standby.address},{dead_address},{active.address}"), None, None
    )
    try:
        with pytest.raises(GRPCError):
            await connector.call(
                lambda chan: pb.TimeSliceOrchestratorServiceStub(chan, timeout=3).list_groups(
                    pb.ListGroupsRequest()
                )
            )
        assert connector.current is not None and connector.current.dial == ours  # not dead
        reply = await connector.call(
            lambda chan: pb.TimeSliceOrchestratorServiceStub(chan, timeout=3).list_groups(
                pb.ListGroupsRequest()
            )
        )
        assert reply.group_ids == []
    finally:
        connector.close()
        await active.close()
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await standby.close()


@pytest.mark.parametrize("http2", ["h2core", "grpclib"])
async def test_a_refusal_naming_the_active_is_followed_past_the_list_order(http2: str) -> None:
    """Candidates A, B, C: A refuses, naming C as the active in its trailers; the
    next call goes to C, not to B next in the list, on either client."""
    from timeslice.api.h2serve import Call, H2Server, Route
    from timeslice.api.serving import listening_socket
    from timeslice.errors import Code

    async with Orchestrator() as active:
        asked: dict[str, int] = {"a": 0, "b": 0}
        acquire = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/Acquire"

        def refusing(name: str, names: str) -> Route:
            async def handle(call: Call) -> None:
                asked[name] += 1
                await call.recv(1 << 20)
                trailers = [(ACTIVE_KEY, names)] if names else []
                call.finish(Code.UNAVAILABLE, "this orchestrator is a standby", trailers)

            return Route(handle)

        servers, addresses = [], []
        for name, names in (("a", active.address), ("b", "")):
            server = H2Server({acquire: refusing(name, names)})
            sock = listening_socket("127.0.0.1", 0)
            await server.start(sock)
            servers.append(server)
            addresses.append(f"127.0.0.1:{sock.getsockname()[1]}")
        targets = ",".join([*addresses, active.address])
        client = AsyncTimeSliceOrchestratorClient(
            targets, "x", "g", lease_ttl_sec=None, reconnect_timeout_sec=10, http2=http2
        )
        try:
            await client.acquire(timeout_sec=10)
            assert active.table.groups["g"].holder is not None
            assert asked == {"a": 1, "b": 0}
        finally:
            await client.close()
            for server in servers:
                await server.stop()
