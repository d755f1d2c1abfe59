"""The agent acts only for its own callers, under an auth policy, over TCP with
bearer tokens and over its Unix socket with peer credentials: the orchestrator's
commands (SwitchGroup, ResetJob, any fencing token) only from an operator; a job
principal only on its own jobs; `cuda` pids only of the caller's user, never pid
1; `app_endpoint` only on loopback unless allowed; a workload channel bound to
whoever opened it. Every refusal has its status, changes nothing, and is logged
with the caller."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import grpclib.client
import pytest
from agent_wire import (
    APP_CHANNEL,
    NOOP,
    STREAM_ENDED,
    JobState,
    OpStatus,
    Workload,
    everything,
    finish_operation,
    grpc_error,
    snapshot,
    wait_for_job,
)
from grpclib.const import Cardinality, Status

from tests.certs import Certs
from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.api.backend_config import backend_of
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client.workload import register_workload
from timeslice.errors import PermissionDeniedError
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.principals import AuthPolicy, Principal, Role, token_sha256
from timeslice.security.tls import ClientTls, ServerTls

pytestmark = pytest.mark.timeout(30)

Stub = pb.SnapshotAgentServiceStub
SERVICE = "/snapshot_agent.v1alpha1.SnapshotAgentService"

TOKENS = {
    "orchestrator": "t-orchestrator",
    "trainer-a": "t-trainer-a",
    "trainer-b": "t-trainer-b",  # may act as job a too: a second principal for one job
    "viewer": "t-viewer",
}
POLICY = AuthPolicy(
    (
        Principal(name="orchestrator", role=Role.OPERATOR, token_sha256=token_sha256(TOKENS["orchestrator"])),
        Principal(name="trainer-a", role=Role.JOB, token_sha256=token_sha256(TOKENS["trainer-a"]),
                  jobs=("a", "a-*"), groups=("g",)),
        Principal(name="trainer-b", role=Role.JOB, token_sha256=token_sha256(TOKENS["trainer-b"]),
                  jobs=("a", "b"), groups=("g",)),
        Principal(name="viewer", role=Role.VIEWER, token_sha256=token_sha256(TOKENS["viewer"]),
                  groups=("g",)),
    )
)  # fmt: skip


@pytest.fixture(params=["h2core", "grpclib"])
async def agent(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Agent]:
    """The agent on each HTTP/2 server, on TCP and on a Unix socket."""
    async with Agent(
        node_name="n1",
        http2=request.param,
        db=f"sqlite:///{tmp_path / 'agent.db'}",
        backends=("noop", "app_channel", "app_endpoint"),
        auth=POLICY,
        socket=str(tmp_path / "agent.sock"),
    ) as running:
        yield running
        running.table.validate()


@pytest.fixture
def stubs(agent: Agent) -> Iterator[Any]:
    """`stubs(name)`: the agent's stub calling as principal `name` (None: no
    token; "unix": over the Unix socket, no token)."""
    channels: list[grpclib.client.Channel] = []

    def make(name: str | None) -> Stub:
        if name == "unix":
            channel = grpclib.client.Channel(path=agent.socket_address.removeprefix("unix:"))
            metadata = None
        else:
            host, _, port = agent.address.rpartition(":")
            channel = grpclib.client.Channel(host, int(port))
            metadata = {"authorization": f"Bearer {TOKENS.get(name, name)}"} if name else None
        channels.append(channel)
        return Stub(channel, timeout=10, metadata=metadata)

    yield make
    for channel in channels:
        channel.close()


def switch(group: str = "g", next_job: str = "a", token: int = 5) -> pb.SwitchGroupRequest:
    jobs = [pb.SwitchJob(job_id=next_job, backend_config=NOOP)]
    return pb.SwitchGroupRequest(
        group=group, next_job_id=next_job, fencing_token=token, timeout_ms=5000, jobs=jobs
    )


def cuda(*pids: int) -> pb.BackendConfig:
    target = pb.ProcessTarget(pids=list(pids))
    return pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=target))


@asynccontextmanager
async def workload(address: str | Agent, job: str, group: str, token: str | None,
                   ) -> AsyncIterator[tuple[Workload, grpclib.client.Stream[Any, Any]]]:  # fmt: skip
    """A raw WorkloadChannel of `job`, as principal `token` (an Agent: over its Unix
    socket); yields it once the register message is sent."""
    if isinstance(address, Agent):
        channel = grpclib.client.Channel(path=address.socket_address.removeprefix("unix:"))
    else:
        host, _, port = address.rpartition(":")
        channel = grpclib.client.Channel(host, int(port))
    metadata = {"authorization": f"Bearer {TOKENS[token]}"} if token else None
    body_done = False
    try:
        async with channel.request(
            f"{SERVICE}/WorkloadChannel", Cardinality.STREAM_STREAM, pb.WorkloadMessage,
            pb.AgentCommand, timeout=20, metadata=metadata,
        ) as stream:  # fmt: skip
            register = pb.RegisterWorkload(job_id=job, group=group)
            await stream.send_message(pb.WorkloadMessage(register=register))
            yield Workload(stream, job, group), stream
            body_done = True
            with suppress(*STREAM_ENDED):
                await stream.end()
    except STREAM_ENDED:  # the stream the agent ended (refused, replaced)
        if not body_done:
            raise
    finally:
        channel.close()


# --- the orchestrator's commands ------------------------------------------------------------


async def test_switch_group_and_fencing_tokens_only_from_the_orchestrator(
    agent: Agent, stubs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    operator = stubs("orchestrator")
    await finish_operation(
        operator, (await stubs("trainer-a").snapshot(snapshot("a", "g", NOOP))).operation_id
    )
    before, tokens = await everything(operator), dict(agent.table.tokens)
    with caplog.at_level(logging.WARNING):
        for name, status in [("trainer-a", Status.PERMISSION_DENIED),
                             ("viewer", Status.PERMISSION_DENIED),
                             ("unix", Status.PERMISSION_DENIED),
                             (None, Status.UNAUTHENTICATED),
                             ("not-a-token", Status.UNAUTHENTICATED)]:  # fmt: skip
            error = await grpc_error(stubs(name).switch_group(switch(token=9)))
            assert error.status == status, (name, error)
            # A Snapshot or Restore that carries a fencing token is the orchestrator's too.
            error = await grpc_error(
                stubs(name).snapshot(snapshot("a", "g", NOOP, fencing_token=9))
            )
            assert error.status == status, (name, error)
            error = await grpc_error(
                stubs(name).restore(pb.RestoreRequest(job_id="a", group="g", fencing_token=9))
            )
            assert error.status == status, (name, error)
    assert await everything(operator) == before and agent.table.tokens == tokens  # nothing changed
    assert "principal trainer-a" in caplog.text and "principal viewer" in caplog.text
    assert f"uid {os.getuid()}" in caplog.text
    # The orchestrator's are taken.
    answer = await operator.switch_group(switch(token=9))
    assert answer.node_name == "n1" and agent.table.tokens["g"] == 9


async def test_reset_job_only_from_an_operator(agent: Agent, stubs: Any) -> None:
    await finish_operation(
        stubs("orchestrator"),
        (await stubs("trainer-a").snapshot(snapshot("a", "g", NOOP))).operation_id,
    )
    for name in ("trainer-a", "viewer", "unix"):
        error = await grpc_error(stubs(name).reset_job(pb.ResetJobRequest(job_id="a", group="g")))
        assert error.status == Status.PERMISSION_DENIED, (name, error)
    # The orchestrator's passes (and finds nothing to reset: the job is not faulted).
    error = await grpc_error(
        stubs("orchestrator").reset_job(pb.ResetJobRequest(job_id="a", group="g"))
    )
    assert error.status == Status.FAILED_PRECONDITION and "not FAULTED" in (error.message or "")


# --- a job principal, on its own jobs -------------------------------------------------------


async def test_a_job_principal_acts_only_as_its_own_jobs(agent: Agent, stubs: Any) -> None:
    trainer_a, trainer_b, operator = stubs("trainer-a"), stubs("trainer-b"), stubs("orchestrator")
    op_b = (await trainer_b.snapshot(snapshot("b", "g", NOOP))).operation_id
    await finish_operation(operator, op_b)
    before = await everything(operator)
    for request in (
        snapshot("b", "g", NOOP),
        snapshot("a", "other", NOOP),
        snapshot("b", "", NOOP),
    ):
        assert (await grpc_error(trainer_a.snapshot(request))).status == Status.PERMISSION_DENIED
    error = await grpc_error(trainer_a.get_operation(pb.GetOperationRequest(operation_id=op_b)))
    assert error.status == Status.PERMISSION_DENIED
    assert await everything(operator) == before
    # Its status shows its own jobs; a viewer's, its groups'; an operator's, all.
    await finish_operation(
        operator, (await trainer_a.snapshot(snapshot("a-1", "g", NOOP))).operation_id
    )
    assert [j.job_id for j in (await trainer_a.status()).job_statuses] == ["a-1"]
    assert sorted(j.job_id for j in (await stubs("viewer").status()).job_statuses) == ["a-1", "b"]
    assert (await grpc_error(stubs(None).status())).status == Status.UNAUTHENTICATED


# --- cuda pids ------------------------------------------------------------------------------


async def test_cuda_pid_1_and_other_users_processes_are_refused_and_not_kept(
    agent: Agent, stubs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        for name in ("trainer-a", "orchestrator", "unix"):
            error = await grpc_error(
                stubs(name).snapshot(snapshot("a", "g", cuda(os.getpid() + 1, 1)))
            )
            assert error.status == Status.PERMISSION_DENIED and "pid 1 " in (error.message or "")
    # A job principal over TCP names only the agent's user's processes, and none of an
    # agent that runs as root (which would let it name root's daemons).
    error = await grpc_error(stubs("trainer-a").snapshot(snapshot("a", "g", cuda(os.getppid()))))
    assert error.status == Status.PERMISSION_DENIED
    assert agent.table.find("g", "a") is None  # nothing kept
    assert "pid 1 " in caplog.text and "principal trainer-a" in caplog.text
    # RegisterJob(cuda pids=[1]) is refused by the check the orchestrator makes
    # before it keeps a job's backend.
    with pytest.raises(PermissionDeniedError, match="pid 1 "):
        backend_of(cuda(1), pb.Backend.UNSPECIFIED)


# --- app_endpoint URLs --------------------------------------------------------------------------


async def test_app_endpoint_calls_only_loopback_unless_allowed(agent: Agent, stubs: Any,
                                                               tmp_path: Path) -> None:  # fmt: skip
    def endpoint(url: str) -> pb.BackendConfig:
        return pb.BackendConfig(app_endpoint=pb.AppEndpointConfig(app=pb.App.VLLM, endpoints=[url]))

    for url in ("http://10.255.255.1:8000", "http://example.com:80", "http://0.0.0.0:8000",
                "http://127.0.0.1.nip.io:8000"):  # fmt: skip
        error = await grpc_error(stubs("orchestrator").snapshot(snapshot("a", "g", endpoint(url))))
        assert error.status == Status.PERMISSION_DENIED and "loopback" in (error.message or "")
    assert agent.table.find("g", "a") is None
    # Allowed by the agent's configuration: called (and, nothing listening, failed).
    async with Agent(node_name="n2", db=None, backends=("app_endpoint",), auth=POLICY,
                     app_endpoint_allow=("http://10.255.255.1:8000",),
                     backend_options={"app_endpoint": {"app_endpoint.timeout_s": "0.5"}},
                     ) as allowing:  # fmt: skip
        host, _, port = allowing.address.rpartition(":")
        channel = grpclib.client.Channel(host, int(port))
        try:
            other = Stub(
                channel, timeout=10, metadata={"authorization": f"Bearer {TOKENS['orchestrator']}"}
            )
            op_id = (
                await other.snapshot(snapshot("a", "g", endpoint("http://10.255.255.1:8000/v1")))
            ).operation_id
            failed = await finish_operation(other, op_id)
            assert failed.status == OpStatus.FAILED and "10.255.255.1" in (failed.error or "")
            denied = await grpc_error(
                other.snapshot(snapshot("b", "g", endpoint("http://10.255.255.1:8001")))
            )
            assert denied.status == Status.PERMISSION_DENIED
        finally:
            channel.close()


# --- workload channels -----------------------------------------------------------------------


async def test_a_workload_channel_is_bound_to_its_principal(agent: Agent, stubs: Any) -> None:
    operator = stubs("orchestrator")
    async with workload(agent.address, "a", "g", "trainer-a") as (first, _):
        await wait_for_job(operator, "a", lambda j: j.backend == "app_channel")
        before = await everything(operator)
        # Another principal that may act as job a too: refused, the first stays.
        async with workload(agent.address, "a", "g", "trainer-b") as (second, _):
            error = await second.ended()
            assert error is not None and error.status == Status.PERMISSION_DENIED, error
        async with workload(agent, "a", "g", None) as (local, _):  # a local user
            error = await local.ended()
            assert error is not None and error.status == Status.PERMISSION_DENIED, error
        assert await everything(operator) == before
        op_id = (await stubs("trainer-a").snapshot(snapshot("a", "g", APP_CHANNEL))).operation_id
        await first.answer(await first.command())  # the first still serves the job
        assert (await finish_operation(operator, op_id)).status == OpStatus.COMPLETE
        # The same principal again: it takes the first's place, and the first is told.
        async with workload(agent.address, "a", "g", "trainer-a") as (again, _):
            ended = await first.ended()
            assert ended is not None and ended.status == Status.ALREADY_EXISTS, ended
            await wait_for_job(operator, "a", lambda j: j.state == JobState.RUNNING)
            op_id = (await operator.snapshot(snapshot("a", "g"))).operation_id
            await again.answer(await again.command())  # the newer one serves it now
            assert (await finish_operation(operator, op_id)).status == OpStatus.COMPLETE


async def test_a_local_caller_is_known_by_its_peer_credentials(agent: Agent, stubs: Any) -> None:
    # No token: over the Unix socket the kernel says who it is.
    async with workload(agent, "a", "g", None) as (first, _):
        operator = stubs("orchestrator")
        await wait_for_job(operator, "a", lambda j: j.backend == "app_channel")
        channel = agent.channels.get("g", "a")
        assert channel is not None and channel.owner == f"uid {os.getuid()}"
        assert f"pid {os.getpid()}" in channel.peer
        assert [j.job_id for j in (await stubs("unix").status()).job_statuses] == ["a"]
        # A TCP principal may not take a local user's channel.
        async with workload(agent.address, "a", "g", "trainer-a") as (tcp, _):
            error = await tcp.ended()
            assert error is not None and error.status == Status.PERMISSION_DENIED, error
        op_id = (await stubs("unix").snapshot(snapshot("a", "g", APP_CHANNEL))).operation_id
        await first.answer(await first.command())
        assert (await finish_operation(operator, op_id)).status == OpStatus.COMPLETE
        # ... but a trainer-a's snapshot of it is refused: the channel is another user's.
        error = await grpc_error(
            stubs("trainer-a").restore(pb.RestoreRequest(job_id="a", group="g"))
        )
        assert error.status == Status.PERMISSION_DENIED


# --- the orchestrator, with its own credentials ------------------------------------------------


@pytest.mark.parametrize("proof", ["token", "certificate"])
async def test_the_orchestrator_switches_an_agent_with_its_own_credentials(
    tmp_path: Path, certs: Certs, proof: str
) -> None:
    """The orchestrator dials the agent as an operator (a token, or a client certificate
    the agent's CA signed, named in its auth file); jobs register their workloads as
    themselves, and a switch moves one job's context out and the other's in."""
    if proof == "token":
        policy, agent_tls = POLICY, None
        orchestrator: dict[str, Any] = {"agent_token": TOKENS["orchestrator"]}
        jobs: dict[str, dict[str, Any]] = {
            job: {"token": TOKENS[f"trainer-{job}"], "credentials_from_env": False}
            for job in ("a", "b")
        }
    else:
        by_subject = [
            Principal(name="orchestrator", role=Role.OPERATOR, cert_subject="CN=orchestrator"),
            *(
                Principal(name=f"trainer-{j}", role=Role.JOB, cert_subject=f"CN=trainer-{j}",
                          jobs=(j,), groups=("g",))
                for j in ("a", "b")
            ),
        ]  # fmt: skip
        policy = AuthPolicy(tuple(by_subject))
        agent_tls = ServerTls(cert=certs.server.cert, key=certs.server.key, client_ca=certs.ca)
        mine = certs.client("orchestrator")
        orchestrator = {"agent_tls": ClientTls(ca=certs.ca, cert=mine.cert, key=mine.key)}
        jobs = {
            job: {
                "tls": ClientTls(
                    ca=certs.ca,
                    cert=certs.client(f"trainer-{job}").cert,
                    key=certs.client(f"trainer-{job}").key,
                ),
                "credentials_from_env": False,
            }
            for job in ("a", "b")
        }
    moved: list[str] = []

    def callbacks(job: str) -> dict[str, Any]:
        return {
            "on_snapshot": lambda mode, tags: moved.append(f"{job} out"),
            "on_restore": lambda tags: moved.append(f"{job} in"),
        }

    async with (
        Orchestrator(switch_timeout=10, **orchestrator) as orch,
        Agent(node_name="n1", backends=("noop", "app_channel"), orchestrator=orch.address,
              groups=("g",), auth=policy, tls=agent_tls) as agent,
    ):  # fmt: skip
        await until(lambda: "n1" in orch.table.nodes.get("g", ()), "the agent joined g")
        registrations = [
            await register_workload(agent.address, job, "g", connect_timeout_sec=10,
                                    **jobs[job], **callbacks(job))
            for job in ("a", "b")
        ]  # fmt: skip
        try:
            await until(lambda: len(agent.channels._channels) == 2, "both registered")
            owners = {job: agent.channels.get("g", job).owner for job in ("a", "b")}  # type: ignore[union-attr]
            assert owners == {"a": "principal trainer-a", "b": "principal trainer-b"}
            grant = await asyncio.wait_for(orch.acquire("g", "a"), 10)
            waiter = asyncio.ensure_future(orch.acquire("g", "b"))
            await until(lambda: "b" in orch.table.groups["g"].queue, "b waits")
            await orch.yield_("g", "a", token=grant.token)
            granted = await asyncio.wait_for(waiter, 10)
            assert granted.job == "b"
            # a's grant moved b out; the switch to b, a out and b back in.
            assert moved == ["b out", "a out", "b in"]
            assert agent.table.jobs[("g", "a")].state.value == "SAVED"
            assert agent.table.tokens["g"] == granted.token
        finally:
            for registration in registrations:
                await registration.close()
