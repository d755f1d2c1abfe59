"""TLS on both services and every client, mTLS, and bearer tokens from the
environment, through the real clients and servers on 127.0.0.1.

A switch runs with every connection over TLS (the job clients, the workloads'
channels, the agent's session with the orchestrator, the orchestrator's calls
to the agent); a client certificate of another CA, or none, is refused at the
handshake before anything reaches a servicer; a token found in TIMESLICE_TOKEN
is what the server's edge knows the caller by.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.certs import Certs
from timeslice import (
    Agent,
    AsyncSnapshotAgentClient,
    AsyncTimeSliceOrchestratorClient,
    Orchestrator,
)
from timeslice.client import TimeSliceOrchestratorClient, register_workload
from timeslice.client.agent_types import app_channel_config
from timeslice.errors import UnauthenticatedError, UnavailableError
from timeslice.security import callers
from timeslice.security.principals import AuthPolicy, Principal, Role, token_sha256
from timeslice.security.tls import ClientTls, ServerTls

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["h2core", "grpclib"])
def http2(request: pytest.FixtureRequest) -> str:
    """The servers' TLS is checked on both HTTP/2 servers."""
    return str(request.param)


def server_tls(certs: Certs, mutual: bool = False) -> ServerTls:
    return ServerTls(
        cert=certs.server.cert, key=certs.server.key, client_ca=certs.ca if mutual else ""
    )


def client_tls(certs: Certs, cn: str = "") -> ClientTls:
    if not cn:
        return ClientTls(ca=certs.ca)
    pair = certs.client(cn)
    return ClientTls(ca=certs.ca, cert=pair.cert, key=pair.key)


async def test_a_switch_runs_with_every_connection_over_mutual_tls(
    certs: Certs, http2: str
) -> None:
    saved: list[str] = []
    orchestrator = client_tls(certs, "orchestrator")
    async with (
        Orchestrator(
            tls=server_tls(certs, mutual=True), agent_tls=orchestrator, http2=http2
        ) as orch,
        Agent(
            node_name="n1",
            http2=http2,
            backends=("app_channel",),
            tls=server_tls(certs, mutual=True),
            orchestrator=orch.address,
            orchestrator_tls=client_tls(certs, "agent-gpu-1"),
            groups=("g",),
        ) as agent,
    ):
        jobs = {}
        workloads = []
        for job in ("a", "b"):
            tls = client_tls(certs, "trainer-a" if job == "a" else "trainer-b")
            jobs[job] = AsyncTimeSliceOrchestratorClient(orch.address, job, "g", tls=tls)
            workloads.append(
                await register_workload(
                    agent.address,
                    job,
                    "g",
                    on_snapshot=lambda mode, tags, job=job: saved.append(job),
                    on_restore=lambda tags: None,
                    tls=tls,
                )
            )
            await jobs[job].register_job(app_channel_config(), node="n1")
        try:
            first = await jobs["a"].acquire(timeout_sec=10)
            assert first.success
            second = asyncio.ensure_future(jobs["b"].acquire(timeout_sec=10))
            await asyncio.sleep(0)
            await jobs["a"].release()
            granted = await second
            assert granted.success and granted.fencing_token > first.fencing_token
            # b's live context made room for a, then a's for b: the agent told each
            # workload over its TLS channel.
            assert saved == ["b", "a"]
            async with AsyncSnapshotAgentClient(
                agent.address, tls=client_tls(certs, "operator")
            ) as agent_client:
                status = await agent_client.status()
            assert {j.job_id for j in status.job_statuses} == {"a", "b"}
            await jobs["b"].release()
        finally:
            for workload in workloads:
                await workload.close()
            for client in jobs.values():
                await client.close()


async def test_mtls_refuses_another_cas_certificate_and_none_at_the_handshake(
    certs: Certs, http2: str
) -> None:
    async with Orchestrator(tls=server_tls(certs, mutual=True), http2=http2) as orch:
        other = ClientTls(ca=certs.ca, cert=certs.other_client.cert, key=certs.other_client.key)
        for tls in (other, client_tls(certs)):
            async with AsyncTimeSliceOrchestratorClient(
                orch.address, "trainer-a", "g", tls=tls, reconnect_timeout_sec=0
            ) as client:
                with pytest.raises(UnavailableError):
                    await client.acquire(timeout_sec=2)
                with pytest.raises(UnavailableError):
                    await client.list_groups()
        assert orch.group_names() == []  # nothing reached the servicer
        async with AsyncTimeSliceOrchestratorClient(
            orch.address, "trainer-a", "g", tls=client_tls(certs, "trainer-a")
        ) as client:
            assert (await client.acquire(timeout_sec=2)).success
            assert orch.group_names() == ["g"]


async def test_a_server_certificate_the_client_does_not_trust_fails_at_once(
    certs: Certs,
) -> None:
    async with Orchestrator(tls=server_tls(certs)) as orch:
        for tls in (ClientTls(ca=certs.other_ca), None):
            async with AsyncTimeSliceOrchestratorClient(
                orch.address, "a", "g", tls=tls, credentials_from_env=False, reconnect_timeout_sec=0
            ) as client:
                began = time.monotonic()
                with pytest.raises(UnavailableError) as raised:
                    await client.list_groups()
                if tls is not None:  # not retried for the 30 s a lost connection is
                    assert "certificate is not trusted" in str(raised.value)
                    assert time.monotonic() - began < 5


async def test_the_token_of_timeslice_token_names_the_caller_at_the_edge(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = AuthPolicy(
        principals=(
            Principal(
                name="dash", role=Role.VIEWER, token_sha256=token_sha256("view-1"), groups=("*",)
            ),
        )
    )
    seen: list[callers.Caller] = []
    async with Orchestrator(tls=server_tls(certs), auth=policy) as orch:
        real = orch.group_names

        def group_names() -> list[str]:
            seen.append(callers.CURRENT.get())
            return real()

        monkeypatch.setattr(orch, "group_names", group_names)
        monkeypatch.setenv("TIMESLICE_TLS_CA", certs.ca)
        monkeypatch.setenv("TIMESLICE_TOKEN", "view-1")
        async with AsyncTimeSliceOrchestratorClient(orch.address) as client:
            assert await client.list_groups() == []
        principal = seen[-1].principal
        assert principal is not None and principal.name == "dash"
        monkeypatch.setenv("TIMESLICE_TOKEN", "not-a-known-token")
        async with AsyncTimeSliceOrchestratorClient(orch.address) as client:
            with pytest.raises(UnauthenticatedError):
                await client.list_groups()
        monkeypatch.delenv("TIMESLICE_TOKEN")
        async with AsyncTimeSliceOrchestratorClient(orch.address) as client:
            with pytest.raises(UnauthenticatedError):
                await client.list_groups()
        assert len(seen) == 1

        # The blocking client, on a thread of its own, finds them there too.
        monkeypatch.setenv("TIMESLICE_TOKEN", "view-1")

        def blocking() -> list[str]:
            with TimeSliceOrchestratorClient(orch.address) as sync:
                return sync.list_groups()

        assert await asyncio.to_thread(blocking) == []
        assert len(seen) == 2 and seen[-1].principal == principal


async def test_a_tls_handshake_never_finished_is_dropped_at_the_header_timeout(
    certs: Certs, http2: str
) -> None:
    async with Orchestrator(tls=server_tls(certs), header_timeout=0.3, http2=http2) as orch:
        host, port = orch.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        began = time.monotonic()
        try:
            async with asyncio.timeout(5):
                assert await reader.read() == b""  # closed by the server, not by us
        finally:
            writer.close()
        assert time.monotonic() - began < 3


async def test_a_refused_handshake_is_logged(
    certs: Certs, caplog: pytest.LogCaptureFixture, http2: str
) -> None:
    async with Orchestrator(tls=server_tls(certs, mutual=True), http2=http2) as orch:
        other = ClientTls(ca=certs.ca, cert=certs.other_client.cert, key=certs.other_client.key)
        for tls in (other, client_tls(certs)):
            async with AsyncTimeSliceOrchestratorClient(
                orch.address, tls=tls, reconnect_timeout_sec=0
            ) as client:
                with pytest.raises(UnavailableError):
                    await client.list_groups()
    refusals = [r.getMessage() for r in caplog.records if "refused a TLS handshake" in r.message]
    assert len(refusals) == 2, refusals
    assert "certificate" in refusals[0]
