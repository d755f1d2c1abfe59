"""The orchestrator's gRPC health service (SERVING when up, NOT_SERVING while
closing, Watch streams told), the HTTP probes that follow it, and the metrics
port refusing what it does not serve."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpclib.client
import httpx
import pytest
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError
from prometheus_client import CollectorRegistry, Counter

from tests.ports import free_port
from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.metrics.http import MetricsServer
from timeslice.orchestrator.server import SERVICE_NAME, Orchestrator

pytestmark = pytest.mark.timeout(30)

Status = health.HealthCheckResponseServingStatus
GET_STATUS = f"/{SERVICE_NAME}/GetGroupStatus"


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@asynccontextmanager
async def channel(address: str) -> AsyncIterator[grpclib.client.Channel]:
    host, port = split(address)
    chan = grpclib.client.Channel(host, port)
    try:
        yield chan
    finally:
        chan.close()


async def probe(address: str, path: str) -> int:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return (await client.get(f"http://{address}{path}")).status_code


async def test_health_is_serving_when_up_and_not_serving_while_closing() -> None:
    orch = Orchestrator(metrics_port=free_port(), drain_timeout=3.0)
    await orch.start()
    try:
        assert orch.metrics_address is not None
        metrics = orch.metrics_address
        async with channel(orch.address) as chan:
            stub = health.HealthStub(chan, timeout=5)
            for name in ("", SERVICE_NAME):
                answer = await stub.check(health.HealthCheckRequest(service=name))
                assert answer.status == Status.SERVING, name
            with pytest.raises(GRPCError) as unknown:
                await stub.check(health.HealthCheckRequest(service="no.such.Service"))
            assert unknown.value.status.name == "NOT_FOUND"
            assert await probe(metrics, "/healthz") == 200
            assert await probe(metrics, "/readyz") == 200

            watch = stub.watch(health.HealthCheckRequest(service=SERVICE_NAME)).__aiter__()
            assert (await watch.__anext__()).status == Status.SERVING
            # A call whose request never comes keeps the close draining for a while.
            with contextlib.suppress(StreamTerminatedError):  # it ends with the server
                async with chan.request(
                    GET_STATUS,
                    Cardinality.UNARY_UNARY,
                    pb.GetGroupStatusRequest,
                    pb.GetGroupStatusResponse,
                ) as held:
                    await held.send_request()
                    await asyncio.sleep(0.1)  # the server has it in flight
                    closing = asyncio.ensure_future(orch.close())
                    told = await asyncio.wait_for(watch.__anext__(), 2.0)
                    assert told.status == Status.NOT_SERVING
                    assert not orch.serving and not closing.done()
                    assert await probe(metrics, "/readyz") == 503
                    assert await probe(metrics, "/healthz") == 200  # the process still serves
                    await closing
    finally:
        await orch.close()
    with pytest.raises(httpx.ConnectError):  # the probe port closed with the server
        await probe(metrics, "/healthz")


async def test_an_agents_health_still_answers_as_before() -> None:
    from timeslice.agent.server import Agent

    async with Agent(node_name="n1", backends=("noop",), metrics_port=free_port()) as agent:
        async with channel(agent.address) as chan:
            stub = health.HealthStub(chan, timeout=5)
            for name in ("", "snapshot_agent.v1alpha1.SnapshotAgentService", "noop"):
                answer = await stub.check(health.HealthCheckRequest(service=name))
                assert answer.status == Status.SERVING, name
            with pytest.raises(GRPCError):
                await stub.check(health.HealthCheckRequest(service="cuda"))  # not served
        assert agent.metrics_address is not None
        assert await probe(agent.metrics_address, "/readyz") == 200


# --- the HTTP endpoint ------------------------------------------------------------------


@asynccontextmanager
async def endpoint(
    ready: list[bool], registry: CollectorRegistry | None = None, **limits: float
) -> AsyncIterator[str]:
    if registry is None:
        registry = CollectorRegistry()
        Counter("probe_test_things", "Things.", registry=registry).inc(3)
    server = MetricsServer("127.0.0.1", 0, registry, lambda: ready[0], **limits)  # type: ignore[arg-type]
    await server.start()
    try:
        yield server.address
    finally:
        await server.stop()


async def exchange(address: str, data: bytes, wait: float = 5.0) -> bytes:
    """Send `data` and read the answer until the server closes the connection (b""
    when it closed or reset it without one)."""
    host, port = split(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), wait)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_the_endpoint_serves_its_three_paths() -> None:
    ready = [True]
    async with endpoint(ready) as address:
        answer = await exchange(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(answer) == 200 and b"probe_test_things_total 3.0" in answer
        head = await exchange(address, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(head) == 200 and head.endswith(b"\r\n\r\n")  # no body
        assert status_of(await exchange(address, b"GET /readyz?x=1 HTTP/1.0\r\n\r\n")) == 200
        ready[0] = False
        assert status_of(await exchange(address, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")) == 503
        assert (
            status_of(await exchange(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")) == 200
        )


async def test_scrapes_render_the_registry_at_most_once_an_interval() -> None:
    """However many scrapers there are, the event loop renders the registry at most
    once per `min_render_interval`; a scrape after it sees what changed."""
    registry = CollectorRegistry()
    things = Counter("probe_test_things", "Things.", registry=registry)
    get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    async with endpoint([True], registry, min_render_interval=1.0) as address:
        first = await exchange(address, get)
        things.inc(5)
        flood = await asyncio.gather(*(exchange(address, get) for _ in range(20)))
        assert all(b"probe_test_things_total 0.0" in answer for answer in [first, *flood])
        await asyncio.sleep(1.1)
        assert b"probe_test_things_total 5.0" in await exchange(address, get)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
        (b"DELETE /readyz HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET /metrics/../etc HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n", 431),
        (b"GET /" + b"m" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
    ],
)
async def test_the_endpoint_refuses_what_it_does_not_serve(
    request_bytes: bytes, status: int
) -> None:
    async with endpoint([True]) as address:
        answer = await exchange(address, request_bytes)
        assert status_of(answer) == status, answer[:200]
        assert b"probe_test_things" not in answer


async def test_a_slow_client_is_dropped_and_connections_are_limited() -> None:
    async with endpoint([True], timeout=0.3, max_connections=2) as address:
        host, port = split(address)
        # Half a request, never finished: dropped once the timeout passes.
        assert await exchange(address, b"GET /metrics HTTP/1.1\r\nHo", wait=3.0) == b""
        idle = [await asyncio.open_connection(host, port) for _ in range(2)]
        await asyncio.sleep(0.05)  # both are being served
        # One more than the limit: closed unanswered, while the others wait.
        assert await exchange(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 3.0) == b""
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(0.4)  # their slots are free again
        answer = await exchange(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(answer) == 200
