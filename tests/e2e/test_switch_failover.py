"""The active orchestrator killed with SIGKILL at each step of a switch, a standby
on the same PostgreSQL journal taking over: the new active finishes the switch,
never with two live contexts on the node, keeps the holder and every waiter's
place, and the clients, given both addresses, follow it with their request ids
(TIMESLICE_TEST_POSTGRES_URL; see test_switch_restart for a restart instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpclib.exceptions import GRPCError
from orchestrator_process import Server, connect
from switch_scenario import GROUP, STEPS, failpoint_env, killed_mid_switch

from tests.optional import need_postgres
from tests.ports import free_port
from tests.postgres import scratch_database
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LEASE = 1.0


@pytest.fixture
async def journal() -> AsyncIterator[str]:
    async with scratch_database(need_postgres(), f"timeslice_switch_failover_{os.getpid()}") as url:
        yield url


async def _role(port: int) -> str:
    async with connect(port) as stub:
        with contextlib.suppress(OSError, GRPCError, TimeoutError):
            return (await stub.get_leadership(pb.GetLeadershipRequest(), timeout=1)).role
    return ""


async def _until_role(port: int, role: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await _role(port) != role:
        assert time.monotonic() < deadline, f"127.0.0.1:{port} never became {role}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("step", STEPS)
async def test_a_standby_finishes_the_switch_the_killed_active_began(
    step: str, journal: str, tmp_path: Path
) -> None:
    ports = [free_port(), free_port()]
    options = ("--group-nodes", f"{GROUP}=n1", "--recovery-grace", "20",
               "--leader-lease", str(LEASE))  # fmt: skip
    active = Server(ports[0], journal, tmp_path / "active.log", *options, env=failpoint_env(step))
    standby: Server | None = None
    try:
        await active.ready()
        standby = Server(ports[1], journal, tmp_path / "standby.log", *options)
        await _until_role(ports[1], "standby", 30)

        async def taken_over() -> None:
            await _until_role(ports[1], "active", LEASE + 10)

        targets = ",".join(f"127.0.0.1:{port}" for port in ports)
        await killed_mid_switch(
            step, tmp_path, targets, active.process, taken_over, lease_ttl_sec=30
        )
    finally:
        for server in (active, standby):
            if server is not None and server.process.poll() is None:
                server.process.kill()
                server.process.wait(10)
