"""The servers' limits on what peers may hold, on 127.0.0.1: connections, streams
per connection, silent and idle connections, half-sent requests and Watch streams.
Over a limit a caller is answered RESOURCE_EXHAUSTED, and nobody else notices."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import grpclib.client
import pytest
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from orchestrator_wire import SERVICE, orchestrator_stub, split_address

from timeslice import Agent
from timeslice.agent.server import AgentConfig
from timeslice.api.connections import ConnectionLimits, warn_if_files_run_short
from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.server import Orchestrator, OrchestratorConfig

Stub = pb.TimeSliceOrchestratorServiceStub


@pytest.fixture(params=["h2core", "grpclib"])
def http2(request: pytest.FixtureRequest) -> str:
    """Each limit is checked on both HTTP/2 servers."""
    return str(request.param)


async def read_until_closed(address: str, send: bytes = b"", within: float = 5.0) -> float:
    """Open a plain TCP connection to `address`, send `send`, and read until the
    server closes it; the seconds that took (fails after `within`)."""
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    try:
        writer.write(send)
        async with asyncio.timeout(within):
            while await reader.read(65536):
                pass
        return time.monotonic() - started
    finally:
        writer.close()


@asynccontextmanager
async def watch_stream(orch: Orchestrator, stub: Stub, group: str = "") -> AsyncIterator[Any]:
    """A Watch stream of `group`, open once the orchestrator counts it."""
    before = orch.watches.count
    request = stub.channel.request(
        f"{SERVICE}/Watch", Cardinality.UNARY_STREAM, pb.WatchRequest, pb.WatchEvent, timeout=30
    )
    async with request as stream:
        await stream.send_message(pb.WatchRequest(group_id=group), end=True)
        await until(lambda: orch.watches.count > before)
        yield stream
        await stream.cancel()


async def next_event(stream: Any, kind: pb.WatchEventKind) -> pb.WatchEvent:
    """The next event of `kind` on a Watch stream, skipping others."""
    async with asyncio.timeout(5):
        while (event := await stream.recv_message()).kind is not kind:
            pass
    assert isinstance(event, pb.WatchEvent)
    return event


def census(server: Orchestrator | Agent) -> set[Any]:
    assert server._server is not None
    return server._server.connections.open


async def until(check: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


# --- connections ------------------------------------------------------------------------


async def test_a_connection_over_the_limit_is_answered_resource_exhausted(http2: str) -> None:
    async with Orchestrator(max_connections=2, http2=http2) as orch, AsyncExitStack() as stack:
        first = await stack.enter_async_context(orchestrator_stub(orch.address))
        second = await stack.enter_async_context(orchestrator_stub(orch.address))
        await first.list_groups(pb.ListGroupsRequest())
        await second.list_groups(pb.ListGroupsRequest())
        async with orchestrator_stub(orch.address) as third:
            with pytest.raises(GRPCError) as refused:
                await third.list_groups(pb.ListGroupsRequest())
        assert refused.value.status is Status.RESOURCE_EXHAUSTED
        assert refused.value.message == "the orchestrator has 2 connections, its limit"
        # Those within the limit never noticed.
        await first.list_groups(pb.ListGroupsRequest())
        # A connection that closes makes room for the next.
        first.channel.close()
        await until(lambda: len(census(orch)) == 1)
        async with orchestrator_stub(orch.address) as fourth:
            await fourth.list_groups(pb.ListGroupsRequest())


async def test_the_agent_refuses_a_connection_over_its_limit(http2: str) -> None:
    async with Agent(node_name="n1", backends=("noop",), max_connections=1, http2=http2) as agent:
        host, port = split_address(agent.address)
        first, second = grpclib.client.Channel(host, port), grpclib.client.Channel(host, port)
        try:
            request = health.HealthCheckRequest()
            await health.HealthStub(first, timeout=5).check(request)
            with pytest.raises(GRPCError) as refused:
                await health.HealthStub(second, timeout=5).check(request)
            assert refused.value.status is Status.RESOURCE_EXHAUSTED
            assert refused.value.message == "the agent has 1 connections, its limit"
        finally:
            first.close()
            second.close()


async def test_a_refused_connection_is_closed_after_its_answer(http2: str) -> None:
    async with (
        Orchestrator(max_connections=1, http2=http2) as orch,
        orchestrator_stub(orch.address) as first,
    ):
        await first.list_groups(pb.ListGroupsRequest())
        async with orchestrator_stub(orch.address) as second:
            with pytest.raises(GRPCError):
                await second.list_groups(pb.ListGroupsRequest())
            protocol = second.channel._protocol
            assert protocol is not None
            await until(lambda: protocol.handler.connection_lost, within=3)
        assert len(census(orch)) == 1


def test_too_few_open_files_for_the_connection_limit_are_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    warn_if_files_run_short(ConnectionLimits(max_connections=100), "the agent")
    assert not caplog.records
    warn_if_files_run_short(ConnectionLimits(max_connections=1000), "the agent")
    assert "the agent allows 1000 connections but may open only 1024 files" in caplog.text


# --- streams per connection -----------------------------------------------------------


async def test_a_connection_holds_at_most_its_streams(http2: str) -> None:
    async with Orchestrator(max_streams_per_connection=2, http2=http2) as orch:
        async with (
            orchestrator_stub(orch.address) as stub,
            orchestrator_stub(orch.address) as other,
        ):
            async with watch_stream(orch, stub), watch_stream(orch, stub):
                protocol = stub.channel._protocol
                assert protocol is not None
                settings = protocol.connection._connection.remote_settings
                assert settings.max_concurrent_streams == 2
                # A third call on the same connection waits for a free stream (the
                # client queues it) ...
                with pytest.raises(asyncio.TimeoutError):
                    await stub.list_groups(pb.ListGroupsRequest(), timeout=0.5)
                # ... and on another connection it is served at once.
                await other.list_groups(pb.ListGroupsRequest())
            await stub.list_groups(pb.ListGroupsRequest())


# --- silent and idle connections ------------------------------------------------------


async def test_a_connection_that_sends_no_request_is_closed(http2: str) -> None:
    async with Orchestrator(header_timeout=0.3, http2=http2) as orch:
        assert 0.25 < await read_until_closed(orch.address) < 3
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
        assert 0.25 < await read_until_closed(orch.address, preface) < 3
        await until(lambda: not census(orch))


async def test_the_agent_closes_a_connection_that_sends_no_request(http2: str) -> None:
    async with Agent(node_name="n1", backends=("noop",), header_timeout=0.3, http2=http2) as agent:
        assert 0.25 < await read_until_closed(agent.address) < 3


async def test_an_idle_connection_is_closed_and_one_with_a_stream_open_is_not(http2: str) -> None:
    async with Orchestrator(idle_timeout=0.3, http2=http2) as orch:
        async with orchestrator_stub(orch.address) as idle, orchestrator_stub(orch.address) as busy:
            await idle.list_groups(pb.ListGroupsRequest())
            async with watch_stream(orch, busy, "g") as watching:
                await until(lambda: len(census(orch)) == 1, within=3)
                await asyncio.sleep(0.6)  # twice the idle timeout: the Watch holds its own
                assert len(census(orch)) == 1
                await busy.acquire(pb.AcquireRequest(group_id="g", job_id="a"))
                granted = await next_event(watching, pb.WatchEventKind.GRANTED)
                assert granted.job_id == "a"
            # The client behind the closed connection simply connects again.
            await idle.list_groups(pb.ListGroupsRequest())


# --- half-sent requests ---------------------------------------------------------------


async def test_a_request_whose_message_never_comes_is_ended(http2: str) -> None:
    async with (
        Orchestrator(message_timeout=0.3, http2=http2) as orch,
        orchestrator_stub(orch.address) as stub,
    ):
        route = f"{SERVICE}/Acquire"
        request = stub.channel.request(
            route, Cardinality.UNARY_UNARY, pb.AcquireRequest, pb.AcquireResponse, timeout=5
        )
        started = time.monotonic()
        with pytest.raises(GRPCError) as ended:
            async with request as stream:
                await stream.send_request()  # headers only, and no message
                # The answer comes, then the server resets the stream it no longer reads.
                with contextlib.suppress(GRPCError, StreamTerminatedError):
                    await stream.recv_message()
        assert ended.value.status is Status.RESOURCE_EXHAUSTED
        assert ended.value.message == "the request message did not arrive within 0.3 s"
        assert time.monotonic() - started < 3
        # A call that waits longer than that for its grant, its request sent, is not cut.
        await stub.acquire(pb.AcquireRequest(group_id="g", job_id="a"))
        waiting = asyncio.ensure_future(stub.acquire(pb.AcquireRequest(group_id="g", job_id="b")))
        await asyncio.sleep(0.6)
        await stub.yield_(pb.YieldRequest(group_id="g", job_id="a"))
        assert (await asyncio.wait_for(waiting, 5)).success


# --- Watch streams --------------------------------------------------------------------


async def test_a_watch_over_the_limit_is_answered_resource_exhausted(http2: str) -> None:
    async with (
        Orchestrator(max_watchers=2, http2=http2) as orch,
        orchestrator_stub(orch.address) as stub,
    ):
        async with watch_stream(orch, stub):
            async with watch_stream(orch, stub):
                with pytest.raises(GRPCError) as refused:
                    async for _ in stub.watch(pb.WatchRequest()):
                        pass
                assert refused.value.status is Status.RESOURCE_EXHAUSTED
                assert "2 watchers" in refused.value.message
            await until(lambda: orch.watches.count == 1)
            async with watch_stream(orch, stub):  # a watch that ended made room
                pass


# --- configuration --------------------------------------------------------------------


@pytest.mark.parametrize(
    "option",
    [
        {"max_connections": 0},
        {"max_streams_per_connection": 0},
        {"header_timeout": 0},
        {"idle_timeout": -1.0},
        {"message_timeout": float("nan")},
    ],
)
def test_limits_out_of_range_are_refused(option: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        OrchestratorConfig(**option)
    with pytest.raises(InvalidArgumentError):
        AgentConfig(node_name="n1", **option)


def test_watch_limits_out_of_range_are_refused() -> None:
    for option in ({"max_watchers": 0}, {"watch_backlog": 0}):
        with pytest.raises(InvalidArgumentError):
            OrchestratorConfig(**option)
