"""Active and standby orchestrators on one PostgreSQL journal
(TIMESLICE_TEST_POSTGRES_URL): the second waits as a standby (NOT_SERVING on
health, /readyz 503, every call UNAVAILABLE), takes over within the leader
lease plus 2 s when the active goes, and grants with a higher fencing token; an
active frozen past its lease (SIGSTOP) grants nothing once it wakes: it steps
down and exits non-zero."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import grpclib.client
import httpx
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from tests.ports import free_port
from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.orchestrator.journal import SqlJournal
from timeslice.orchestrator.journal_claim import PostgresClaim
from timeslice.orchestrator.server import Orchestrator

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set"),
]
LEASE = 0.6
Serving = health.HealthCheckResponseServingStatus


def channel(address: str) -> grpclib.client.Channel:
    host, _, port = address.rpartition(":")
    return grpclib.client.Channel(host, int(port))


async def health_of(address: str) -> Serving:
    chan = channel(address)
    try:
        answer = await health.HealthStub(chan, timeout=2).check(health.HealthCheckRequest())
        return answer.status
    finally:
        chan.close()


async def leadership_of(address: str) -> pb.GetLeadershipResponse:
    chan = channel(address)
    try:
        stub = pb.TimeSliceOrchestratorServiceStub(chan, timeout=3)
        return await stub.get_leadership(pb.GetLeadershipRequest())
    finally:
        chan.close()


async def role_metric(address: str | None, expected: str) -> str:
    """The role whose `timeslice_orchestrator_role` series is 1 (the one role that is),
    once it is `expected` or two seconds have passed (a page is rendered at most once
    a second)."""
    deadline = time.monotonic() + 2.5
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            text = (await http.get(f"http://{address}/metrics")).text
            pattern = r'^timeslice_orchestrator_role\{role="(\w+)"\} 1\.0$'
            [role] = re.findall(pattern, text, re.M)
            if role == expected or time.monotonic() > deadline:
                return role
            await asyncio.sleep(0.1)


def serve_process(database: str) -> tuple[subprocess.Popen[bytes], str]:
    """`timeslice serve orchestrator` on `database` with the tests' lease, and its
    address."""
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "timeslice", "serve", "orchestrator", "--db", database]
        + ["--port", str(port)],
        env={**os.environ, "TIMESLICE_LEADER_LEASE": str(LEASE)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return child, f"127.0.0.1:{port}"


async def until_role(child: subprocess.Popen[bytes], address: str, role: str) -> None:
    """Wait until the orchestrator process at `address` says it is `role`."""
    deadline = time.monotonic() + 20
    while True:
        assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
        with contextlib.suppress(OSError, GRPCError, TimeoutError):
            if (await leadership_of(address)).role == role:
                return
        assert time.monotonic() < deadline, f"{address} did not become {role}"
        await asyncio.sleep(0.1)


async def acquire(address: str, group: str, job: str) -> pb.AcquireResponse:
    chan = channel(address)
    try:
        stub = pb.TimeSliceOrchestratorServiceStub(chan, timeout=3)
        return await stub.acquire(pb.AcquireRequest(group_id=group, job_id=job, request_id=job))
    finally:
        chan.close()


async def test_a_standby_refuses_calls_and_takes_over_when_the_active_closes(
    database: str,
) -> None:
    active = Orchestrator(db=database, leader_lease=LEASE)
    standby = Orchestrator(db=database, leader_lease=LEASE, metrics_port=free_port())
    await active.start()
    starting: asyncio.Future[None] | None = None
    try:
        first = await active.acquire("g", "x")
        await active.yield_("g", "x", token=first.token)
        starting = asyncio.ensure_future(standby.start())
        while standby._address is None or standby.metrics_address is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(LEASE)  # renewed meanwhile: it stays a standby
        assert not starting.done()
        assert await health_of(standby.address) == Serving.NOT_SERVING
        async with httpx.AsyncClient(timeout=2) as http:
            ready = await http.get(f"http://{standby.metrics_address}/readyz")
        assert ready.status_code == 503
        with pytest.raises(GRPCError) as refused:
            await acquire(standby.address, "g", "y")
        assert refused.value.status is Status.UNAVAILABLE
        assert "standby" in (refused.value.message or "")
        assert await health_of(active.address) == Serving.SERVING
        # Each says where it stands (the standby too), and the metrics carry the role.
        led, waiting = await leadership_of(active.address), await leadership_of(standby.address)
        assert (led.role, waiting.role) == ("active", "standby")
        assert led.lease_epoch == waiting.lease_epoch > 0
        assert led.lease_ms == waiting.lease_ms == round(LEASE * 1000)
        assert 0 < led.lease_left_ms <= LEASE * 1000 and 0 <= waiting.lease_left_ms
        assert waiting.holder == led.holder != ""
        assert led.table_epoch > 0 and waiting.table_epoch == 0
        assert await role_metric(standby.metrics_address, "standby") == "standby"

        closed = time.monotonic()
        await active.close()
        await asyncio.wait_for(starting, LEASE + 2)
        grant = await standby.acquire("g", "y")
        assert time.monotonic() - closed < LEASE + 2
        assert grant.token > first.token
        assert await health_of(standby.address) == Serving.SERVING
        took = await leadership_of(standby.address)
        assert took.role == "active" and took.lease_epoch == led.lease_epoch + 1
        assert took.table_epoch == led.table_epoch + 1
        assert await role_metric(standby.metrics_address, "active") == "active"
    finally:
        await active.close()
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await standby.close()


async def test_an_active_frozen_past_its_lease_grants_nothing_when_it_wakes(
    database: str,
) -> None:
    child, address = serve_process(database)
    standby = Orchestrator(db=database, leader_lease=LEASE)
    starting: asyncio.Future[None] | None = None
    try:
        await until_role(child, address, "active")
        first = await acquire(address, "g", "x")
        starting = asyncio.ensure_future(standby.start())
        await asyncio.sleep(LEASE)
        assert not starting.done()

        child.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        await asyncio.wait_for(starting, LEASE + 2)
        assert time.monotonic() - frozen < LEASE + 2
        # x's hold came over with the journal; once x yields, y's grant is fenced higher
        await standby.yield_("g", "x", token=first.fencing_token)
        grant = await standby.acquire("g", "y")
        assert grant.token > first.fencing_token

        child.send_signal(signal.SIGCONT)
        # It grants nothing after it wakes: it refuses the call, has already stepped
        # down and stopped listening, or steps down with the call in flight (its
        # connection then closes unanswered); the holder is checked below.
        with pytest.raises((GRPCError, ConnectionRefusedError, StreamTerminatedError)) as refused:
            await acquire(address, "g", "z")
        if isinstance(refused.value, GRPCError):
            assert refused.value.status is Status.UNAVAILABLE
        code = await asyncio.to_thread(child.wait, 10)
        assert code != 0
        stderr = child.stderr.read().decode() if child.stderr else ""
        assert "the orchestrator stopped" in stderr
        assert standby.table.groups["g"].holder is not None
        assert standby.table.groups["g"].holder.job == "y"
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
        if child.stderr is not None:
            child.stderr.close()
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await standby.close()


async def test_an_active_past_its_lease_answers_nothing_even_from_memory(database: str) -> None:
    """A KeepAlive needs no journal write: an active whose lease has run out by its
    own clock (its renewals stopped, as in a process frozen between two of them)
    must still refuse it, and step down, rather than tell a holder its lease holds
    while a standby has taken over."""
    active = Orchestrator(db=database, leader_lease=LEASE)
    standby = Orchestrator(db=database, leader_lease=LEASE)
    await active.start()
    starting: asyncio.Future[None] | None = None
    try:
        granted = await active.acquire("g", "x", lease_ttl=30)
        journal = active._journal
        assert isinstance(journal, SqlJournal) and journal.lease is not None
        # It stops renewing, and watching its advisory lock, without noticing
        # anything: as a frozen process would.
        claim = journal._claim
        assert isinstance(claim, PostgresClaim)
        claim._driver.remove_termination_listener(claim._listener)
        watchers = [journal.lease._task, claim._task]
        for task in watchers:
            assert task is not None
            task.cancel()
        await asyncio.gather(*filter(None, watchers), return_exceptions=True)
        starting = asyncio.ensure_future(standby.start())
        await asyncio.wait_for(starting, LEASE + 2)

        chan = channel(active.address)
        try:
            stub = pb.TimeSliceOrchestratorServiceStub(chan, timeout=3)
            with pytest.raises(GRPCError) as refused:
                await stub.keep_alive(
                    pb.KeepAliveRequest(group_id="g", job_id="x", lease_id=granted.lease.lease_id)
                )
        finally:
            chan.close()
        assert refused.value.status is Status.UNAVAILABLE
        assert "leader lease ran out" in (refused.value.message or "")
        assert not active.serving
        await asyncio.wait_for(active.wait_stopped(), 5)
        assert active.failure is not None
    finally:
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await active.close()
        await standby.close()


async def test_a_standby_stops_cleanly_on_sigterm(database: str) -> None:
    """A supervisor stops a standby as it stops an active: SIGTERM, exit 0."""
    active = Orchestrator(db=database, leader_lease=LEASE)
    await active.start()
    child, address = serve_process(database)
    try:
        await until_role(child, address, "standby")
        child.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(child.wait, 10) == 0
        assert active.serving  # it never took over
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stderr is not None:
            child.stderr.close()
        await active.close()
