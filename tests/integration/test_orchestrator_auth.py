"""The orchestrator under an auth policy, called over the wire with bearer tokens,
over plain TCP and over TLS.

Each attack a caller who knows only job and group names could make on an open
orchestrator, made again against one with an auth file: refused with the right
status (UNAUTHENTICATED without credentials, PERMISSION_DENIED otherwise), the
table and the journal as they were, the refusal logged with the principal. And
what each role may still do, and see.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from orchestrator_wire import grpc_status

from tests.certs import Certs
from timeslice import AsyncTimeSliceOrchestratorClient
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client._transport import close_channel, open_channel
from timeslice.errors import NotHolderError, PermissionDeniedError
from timeslice.ids import parse_target
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.principals import AuthPolicy, Principal, Role, token_sha256
from timeslice.security.tls import ClientTls, ServerTls

pytestmark = pytest.mark.timeout(30)

Stub = pb.TimeSliceOrchestratorServiceStub
Kind = pb.WatchEventKind
NOOP = apb.BackendConfig(named=apb.NamedBackendConfig(name="noop"))


def principal(name: str, role: Role, **patterns: tuple[str, ...]) -> Principal:
    return Principal(name=name, role=role, token_sha256=token_sha256(f"{name}-token"), **patterns)


POLICY = AuthPolicy(
    (
        principal("alice", Role.JOB, jobs=("alice",), groups=("g", "h")),
        principal("bob", Role.JOB, jobs=("bob",), groups=("g", "h")),
        # Another principal allowed the same job id: the grant is still not its.
        principal("twin", Role.JOB, jobs=("alice",), groups=("*",)),
        principal("viewer", Role.VIEWER, groups=("g",)),
        principal("ops", Role.OPERATOR),
        principal("gpu1", Role.AGENT, nodes=("gpu-1",)),
        principal("gpu2", Role.AGENT, nodes=("gpu-2",)),
    )
)


def as_(name: str) -> dict[str, str]:
    """The metadata of a call made as principal `name`."""
    return {"authorization": f"Bearer {name}-token"}


Transport = tuple[ServerTls | None, ClientTls | None, str]


@pytest.fixture(params=["plain", "tls", "grpclib", "grpclib-tls"])
def transport(request: pytest.FixtureRequest, certs: Certs) -> Transport:
    """Each attack is made over plain TCP and over TLS (the token then travels
    encrypted; it is still what names the caller), to the orchestrator on our own
    HTTP/2 server (the default) and on grpclib's (`http2="grpclib"`)."""
    http2 = "grpclib" if request.param.startswith("grpclib") else "h2core"
    if request.param.endswith("tls"):
        tls = ServerTls(cert=certs.server.cert, key=certs.server.key)
        return tls, ClientTls(ca=certs.ca), http2
    return None, None, http2


@pytest.fixture
def client_tls(transport: Transport) -> ClientTls | None:
    return transport[1]


@pytest.fixture
async def orch(transport: Transport) -> AsyncIterator[Orchestrator]:
    server_tls, _, http2 = transport
    async with Orchestrator(auth=POLICY, tls=server_tls, http2=http2) as orchestrator:
        yield orchestrator
        orchestrator.table.validate()


@pytest.fixture
async def stub(orch: Orchestrator, client_tls: ClientTls | None) -> AsyncIterator[Stub]:
    channel = open_channel(parse_target(orch.address), client_tls, None)
    try:
        yield Stub(channel, timeout=10)
    finally:
        close_channel(channel)


@pytest.fixture
async def alice_holds(stub: Stub) -> pb.AcquireResponse:
    """alice holds group g (and b waits for nothing)."""
    return await stub.acquire(
        pb.AcquireRequest(job_id="alice", group_id="g"), metadata=as_("alice")
    )


async def last_seq(orch: Orchestrator) -> int:
    assert orch.engine is not None
    return (await orch.engine.journal.load()).last_seq


@asynccontextmanager
async def unchanged(orch: Orchestrator) -> AsyncIterator[None]:
    """The table and the journal are as they were when the block ends."""
    before, seq = orch.table.to_dict(), await last_seq(orch)
    yield
    assert orch.table.to_dict() == before
    assert await last_seq(orch) == seq


async def refused(
    orch: Orchestrator,
    caplog: pytest.LogCaptureFixture,
    call: Callable[[], Awaitable[Any]],
    status: Status,
    *logged: str,
) -> None:
    """`call` fails with `status`, changes nothing, and a warning names `logged`."""
    caplog.clear()
    async with unchanged(orch):
        with caplog.at_level(logging.WARNING):
            assert await grpc_status(call()) is status
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    for text in logged:
        assert text in warnings, (text, warnings)


async def first_event(stub: Stub, group: str, metadata: dict[str, str] | None) -> pb.WatchEvent:
    async for event in stub.watch(pb.WatchRequest(group_id=group), metadata=metadata):
        return event
    raise AssertionError("the watch ended")


def report(node: str, *, groups: tuple[str, ...] = (), gone: str = "") -> pb.AgentReport:
    jobs = [apb.JobStatus(job_id=gone, group="g", liveness=apb.Liveness.GONE)] if gone else []
    return pb.AgentReport(node_name=node, address="127.0.0.1:1", groups=list(groups), jobs=jobs)


# --- no credentials -----------------------------------------------------------------


def every_call(stub: Stub, md: dict[str, str] | None) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every RPC, each made as the caller of `md` (None: without credentials)."""
    lease = pb.KeepAliveRequest(group_id="g", job_id="alice", lease_id="lease-1")
    nodes = pb.SetGroupNodesRequest(group_id="g", nodes=["127.0.0.1:1"])
    return {
        "acquire": lambda: stub.acquire(pb.AcquireRequest(job_id="alice", group_id="g"), metadata=md),
        "yield": lambda: stub.yield_(pb.YieldRequest(job_id="alice", group_id="g"), metadata=md),
        "keep-alive": lambda: stub.keep_alive(lease, metadata=md),
        "list-groups": lambda: stub.list_groups(pb.ListGroupsRequest(), metadata=md),
        "status": lambda: stub.get_group_status(pb.GetGroupStatusRequest(group_id="g"), metadata=md),
        "watch": lambda: first_event(stub, "g", md),
        "force-release": lambda: stub.force_release(pb.ForceReleaseRequest(group_id="g"), metadata=md),
        "register-job": lambda: stub.register_job(pb.RegisterJobRequest(group_id="g", job_id="alice"), metadata=md),
        "reset-job": lambda: stub.reset_job(pb.ResetJobRequest(group_id="g", job_id="alice"), metadata=md),
        "set-group-nodes": lambda: stub.set_group_nodes(nodes, metadata=md),
        "agent-session": lambda: stub.agent_session([report("gpu-1", groups=("g",))], metadata=md),
        "list-agents": lambda: stub.list_agents(pb.ListAgentsRequest(), metadata=md),
    }  # fmt: skip


CALLS = [
    "acquire", "yield", "keep-alive", "list-groups", "status", "watch", "force-release",
    "register-job", "reset-job", "set-group-nodes", "agent-session", "list-agents",
]  # fmt: skip


@pytest.mark.parametrize("name", CALLS)
async def test_a_call_without_credentials_is_unauthenticated(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
    name: str,
) -> None:
    call = every_call(stub, None)[name]
    await refused(orch, caplog, call, Status.UNAUTHENTICATED, "no credentials")


async def test_an_unknown_token_is_unauthenticated(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await refused(
        orch,
        caplog,
        lambda: stub.yield_(
            pb.YieldRequest(job_id="alice", group_id="g"), metadata={"authorization": "Bearer x"}
        ),
        Status.UNAUTHENTICATED,
        "unknown token",
    )


# --- the attacks, each by a principal it is not -------------------------------------


async def test_another_principal_cannot_yield_alices_grant(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = alice_holds.fencing_token  # anyone who reads the status knows it
    for who, why in [("bob", "may not act as job alice"), ("twin", "another principal")]:
        for fencing in (None, token):
            request = pb.YieldRequest(job_id="alice", group_id="g", fencing_token=fencing)
            await refused(
                orch,
                caplog,
                lambda: stub.yield_(request, metadata=as_(who)),
                Status.PERMISSION_DENIED,
                f"principal {who}",
                why,
            )
    answer = await stub.yield_(pb.YieldRequest(job_id="alice", group_id="g"), metadata=as_("alice"))
    assert answer.success


async def test_a_job_principal_cannot_force_release(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for who in ("alice", "bob", "viewer", "gpu1"):
        await refused(
            orch,
            caplog,
            lambda: stub.force_release(pb.ForceReleaseRequest(group_id="g"), metadata=as_(who)),
            Status.PERMISSION_DENIED,
            f"principal {who}",
            "may not force release",
        )
    caplog.clear()
    with caplog.at_level(logging.INFO):
        released = await stub.force_release(
            pb.ForceReleaseRequest(group_id="g", reason="stuck"), metadata=as_("ops")
        )
    assert released.released_job_id == "alice"
    assert "operator action by principal ops: force-released group g from job alice" in caplog.text


async def test_another_principal_cannot_take_alices_live_grant_with_a_new_request(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for who, why in [("twin", "another principal"), ("bob", "may not act as job alice")]:
        request = pb.AcquireRequest(job_id="alice", group_id="g", request_id=f"new-{who}")
        await refused(
            orch,
            caplog,
            lambda: stub.acquire(request, metadata=as_(who)),
            Status.PERMISSION_DENIED,
            f"principal {who}",
            why,
        )
    # alice herself asking again is answered with the same grant and lease
    again = await stub.acquire(
        pb.AcquireRequest(job_id="alice", group_id="g", request_id="again"), metadata=as_("alice")
    )
    assert again.lease.lease_id == alice_holds.lease.lease_id
    assert again.fencing_token == alice_holds.fencing_token


async def test_only_an_operator_resets_a_job(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for who, job in [("alice", "alice"), ("bob", "alice"), ("twin", "alice"), ("viewer", "bob")]:
        request = pb.ResetJobRequest(group_id="g", job_id=job)
        await refused(
            orch,
            caplog,
            lambda: stub.reset_job(request, metadata=as_(who)),
            Status.PERMISSION_DENIED,
            f"principal {who}",
        )
    caplog.clear()
    with caplog.at_level(logging.INFO):
        answer = await stub.reset_job(
            pb.ResetJobRequest(group_id="g", job_id="bob"), metadata=as_("ops")
        )
    assert not answer.was_quarantined
    assert "operator action by principal ops: reset job bob on group g" in caplog.text


async def test_the_status_does_not_show_the_lease_secret_and_cannot_renew_it(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease_id = alice_holds.lease.lease_id
    token = alice_holds.fencing_token
    prefix, secret = f"lease-{token}-", lease_id.removeprefix(f"lease-{token}-")
    assert lease_id.startswith(prefix) and len(secret) >= 20
    # what the status and a watch show anyone (twin may read g)
    status = await stub.get_group_status(
        pb.GetGroupStatusRequest(group_id="g"), metadata=as_("twin")
    )
    shown = status.group.holder_lease.lease_id
    assert shown == f"lease-{token}" and secret not in bytes(status).decode(errors="replace")
    current = await first_event(stub, "g", as_("twin"))
    assert secret not in bytes(current).decode(errors="replace")
    # what a reader of the status can do with it: nothing
    for who, lease, why in [
        ("twin", shown, "another principal"),
        ("twin", lease_id, "another principal"),  # even with the secret
        ("bob", shown, "may not act as job alice"),
    ]:
        request = pb.KeepAliveRequest(group_id="g", job_id="alice", lease_id=lease)
        await refused(
            orch,
            caplog,
            lambda: stub.keep_alive(request, metadata=as_(who)),
            Status.PERMISSION_DENIED,
            f"principal {who}",
            why,
        )
    guess = pb.KeepAliveRequest(group_id="g", job_id="alice", lease_id=shown)
    await refused(
        orch, caplog, lambda: stub.keep_alive(guess, metadata=as_("alice")), Status.ABORTED
    )
    renewed = await stub.keep_alive(
        pb.KeepAliveRequest(group_id="g", job_id="alice", lease_id=lease_id), metadata=as_("alice")
    )
    assert renewed.lease.lease_id == lease_id


async def test_a_fake_agent_session_is_refused_and_its_reports_change_nothing(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = report("gpu-1", groups=("g",), gone="alice")
    for who, why in [
        ("bob", "may not agent session"),
        ("viewer", "may not agent session"),
        ("gpu2", "may not act as node gpu-1"),
    ]:
        await refused(
            orch,
            caplog,
            lambda: stub.agent_session([fake], metadata=as_(who)),
            Status.PERMISSION_DENIED,
            f"principal {who}",
            why,
        )
    assert "gpu-1" not in orch.table.agents and "g" not in orch.table.nodes
    h = orch.table.groups["g"].holder
    assert h is not None and h.job == "alice"  # not revoked by the fake GONE
    # gpu-1's own agent registers, and may not turn into another node mid-session
    with pytest.raises(GRPCError) as caught:
        await stub.agent_session(
            [report("gpu-1", groups=("h",)), report("gpu-2")], metadata=as_("gpu1")
        )
    assert caught.value.status is Status.PERMISSION_DENIED
    assert orch.table.agents == {"gpu-1": "127.0.0.1:1"}
    assert orch.table.nodes == {"h": ("gpu-1",)}
    await stub.agent_session([report("gpu-1")], metadata=as_("gpu1"))


async def test_only_an_operator_sets_a_groups_nodes(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    request = pb.SetGroupNodesRequest(group_id="g", nodes=["10.9.9.9:7070"])
    for who in ("alice", "twin", "viewer", "gpu1"):
        await refused(
            orch,
            caplog,
            lambda: stub.set_group_nodes(request, metadata=as_(who)),
            Status.PERMISSION_DENIED,
            f"principal {who}",
            "may not set group nodes",
        )
    caplog.clear()
    with caplog.at_level(logging.INFO):
        await stub.set_group_nodes(
            pb.SetGroupNodesRequest(group_id="h", nodes=["n1"]), metadata=as_("ops")
        )
    assert orch.table.nodes == {"h": ("n1",)}
    assert "operator action by principal ops: group h spans nodes n1" in caplog.text


async def test_a_job_registers_only_itself(
    orch: Orchestrator, stub: Stub, caplog: pytest.LogCaptureFixture
) -> None:
    await refused(
        orch,
        caplog,
        lambda: stub.register_job(
            pb.RegisterJobRequest(group_id="g", job_id="alice"), metadata=as_("bob")
        ),
        Status.PERMISSION_DENIED,
        "principal bob",
    )
    await stub.register_job(
        pb.RegisterJobRequest(group_id="g", job_id="alice", node="gpu-1", backend_config=NOOP),
        metadata=as_("alice"),
    )
    assert "alice" in orch.table.job_backends["g"]


# --- what each principal sees --------------------------------------------------------


async def test_lists_and_watches_show_only_the_callers_groups(
    orch: Orchestrator,
    stub: Stub,
    alice_holds: pb.AcquireResponse,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await stub.acquire(pb.AcquireRequest(job_id="bob", group_id="h"), metadata=as_("bob"))
    listed = await stub.list_groups(pb.ListGroupsRequest(), metadata=as_("viewer"))
    assert listed.group_ids == ["g"]
    every = await stub.list_groups(pb.ListGroupsRequest(), metadata=as_("ops"))
    assert every.group_ids == ["g", "h"]
    await refused(
        orch,
        caplog,
        lambda: first_event(stub, "h", as_("viewer")),
        Status.PERMISSION_DENIED,
        "principal viewer",
        "may not touch group h",
    )
    # a watch of every group by the viewer: g's events only
    events = stub.watch(pb.WatchRequest(), metadata=as_("viewer"))
    try:
        seen = [await anext(events)]  # the current state: the watch is there now
        for group, job in [("h", "bob"), ("g", "alice")]:
            await stub.yield_(pb.YieldRequest(job_id=job, group_id=group), metadata=as_(job))
        for group in ("h", "g"):
            await stub.acquire(pb.AcquireRequest(job_id="bob", group_id=group), metadata=as_("bob"))
        seen += [await anext(events), await anext(events)]
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    assert [(e.kind, e.group_id, e.job_id) for e in seen] == [
        (Kind.CURRENT, "g", ""),
        (Kind.YIELDED, "g", "alice"),
        (Kind.GRANTED, "g", "bob"),
    ]


async def test_list_agents_shows_only_the_agents_of_the_callers_groups(
    orch: Orchestrator, stub: Stub, alice_holds: pb.AcquireResponse
) -> None:
    await orch.set_group_nodes("g", ("node-g",))
    await orch.set_group_nodes("h", ("node-h",))
    seen = await stub.list_agents(pb.ListAgentsRequest(), metadata=as_("viewer"))
    assert [(a.node, a.groups) for a in seen.agents] == [("node-g", ["g"])]
    every = await stub.list_agents(pb.ListAgentsRequest(), metadata=as_("ops"))
    assert [a.node for a in every.agents] == ["node-g", "node-h"]
    assert every.version and not every.agents[0].address  # no agent registered there


# --- through the real clients, and over mTLS ------------------------------------------


async def test_through_the_clients_a_grant_is_its_principals_alone(
    orch: Orchestrator, client_tls: ClientTls | None
) -> None:
    def client(who: str) -> AsyncTimeSliceOrchestratorClient:
        return AsyncTimeSliceOrchestratorClient(
            orch.address,
            "alice",
            "g",
            tls=client_tls,
            token=f"{who}-token",
            credentials_from_env=False,
        )

    async with client("alice") as alice, client("twin") as twin:
        grant = await alice.acquire(timeout_sec=5)
        assert grant.lease_id.startswith(f"lease-{grant.fencing_token}-")
        assert (await alice.keep_alive()).lease_id == grant.lease_id  # the client's own lease
        with pytest.raises(NotHolderError, match="another principal"):
            await twin.release()
        with pytest.raises(PermissionDeniedError, match="another principal"):
            await twin.acquire(timeout_sec=5)
        status = await twin.get_status()
        assert status.group.locking_job == "alice" and grant.lease_id not in repr(status)
        assert (await alice.release()).success


async def test_over_mtls_an_agent_certificate_registers_only_as_its_node(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    policy = AuthPolicy(
        (Principal(name="gpu1", role=Role.AGENT, cert_subject="CN=agent-gpu-1", nodes=("gpu-1",)),)
    )
    tls = ServerTls(cert=certs.server.cert, key=certs.server.key, client_ca=certs.ca)
    pair = certs.client("agent-gpu-1")
    mine = ClientTls(ca=certs.ca, cert=pair.cert, key=pair.key)
    async with Orchestrator(auth=policy, tls=tls) as orch:
        channel = open_channel(parse_target(orch.address), mine, None)
        try:
            stub = Stub(channel, timeout=10)
            await refused(
                orch,
                caplog,
                lambda: stub.agent_session([report("gpu-2", groups=("g",))]),
                Status.PERMISSION_DENIED,
                "principal gpu1",
                "may not act as node gpu-2",
            )
            assert orch.table.agents == {}
            await stub.agent_session([report("gpu-1", groups=("g",))])
            assert orch.table.agents == {"gpu-1": "127.0.0.1:1"}
        finally:
            close_channel(channel)
