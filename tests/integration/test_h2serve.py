"""The gRPC server on our HTTP/2 connection, called by grpclib's client and by
grpcio's: calls, statuses, deadlines, cancellation, flow control and limits as
both clients expect them; and the orchestrator on it."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import NamedTuple

import grpclib.const
import h2.config
import h2.connection
import h2.settings
import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from benchmarks.common import RawCodec
from tests.certs import Certs
from timeslice import AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.agent.config import AgentConfig
from timeslice.api.h2core import Limits
from timeslice.api.h2serve import Call, CallError, GrpcConnection, H2Server, Route
from timeslice.client import WatchEvent, WatchEventKind
from timeslice.api.serving import listening_socket
from timeslice.errors import Code, InvalidArgumentError
from timeslice.orchestrator.config import OrchestratorConfig
from timeslice.security.tls import ServerTls

pytestmark = pytest.mark.timeout(60)

ECHO, FAIL, CRASH, SLOW, STREAM, FLOOD = (
    f"/test.Lean/{m}" for m in ("Echo", "Fail", "Crash", "Slow", "Stream", "Flood")
)
LIMIT = 4 * 1024 * 1024


def framed(body: bytes) -> bytes:
    return b"\0" + len(body).to_bytes(4, "big") + body


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.sent = 0  # messages a Stream or Flood call sent

    async def echo(self, call: Call) -> None:
        body = await call.recv(LIMIT)
        assert body is not None
        call.send(framed(body * 2 if body.startswith(b"double") else body))

    async def fail(self, call: Call) -> None:
        await call.recv(LIMIT)
        raise CallError(Code.NOT_FOUND, "nö such thing, 100% sure")

    async def crash(self, call: Call) -> None:
        await call.recv(LIMIT)
        raise ValueError("a bug")

    async def slow(self, call: Call) -> None:
        await call.recv(LIMIT)
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def stream(self, call: Call) -> None:
        count = int(await call.recv(LIMIT) or b"0")
        for i in range(count):
            call.send(framed(str(i).encode() * 10_000))
            self.sent += 1
            await call.drain()

    async def flood(self, call: Call) -> None:
        """A handler that queues a whole reply without waiting for the client."""
        count = int(await call.recv(LIMIT) or b"0")
        for _ in range(count):
            call.send(framed(bytes(65_536)))
            self.sent += 1
        await asyncio.sleep(30)

    def routes(self) -> dict[str, Route]:
        return {
            ECHO: Route(self.echo),
            FAIL: Route(self.fail),
            CRASH: Route(self.crash),
            SLOW: Route(self.slow),
            STREAM: Route(self.stream),
            FLOOD: Route(self.flood),
        }


class Served(NamedTuple):
    host: str
    port: int
    handlers: Handlers
    server: H2Server
    channel: Channel  # a grpclib channel to it, closed at the end


@asynccontextmanager
async def serving(h2: Limits | None = None) -> AsyncIterator[Served]:
    handlers = Handlers()
    server = H2Server(handlers.routes(), h2=h2)
    sock = listening_socket("127.0.0.1", 0)
    await server.start(sock)
    host, port = "127.0.0.1", sock.getsockname()[1]
    channel = Channel(host, port, codec=RawCodec())
    try:
        yield Served(host, port, handlers, server, channel)
    finally:
        channel.close()
        await server.stop()


async def until(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


async def unary(channel: Channel, path: str, body: bytes, timeout: float | None = 10) -> bytes:
    async with channel.request(
        path, grpclib.const.Cardinality.UNARY_UNARY, bytes, bytes, timeout=timeout
    ) as stream:
        await stream.send_message(body, end=True)
        reply = await stream.recv_message()
        assert reply is not None
        return reply


async def test_grpclib_calls_it_one_after_another_and_at_once() -> None:
    async with serving() as served:
        channel = served.channel
        for i in range(50):
            assert await unary(channel, ECHO, b"n%d" % i) == b"n%d" % i
        replies = await asyncio.gather(*(unary(channel, ECHO, b"c%d" % i) for i in range(80)))
        assert replies == [b"c%d" % i for i in range(80)]
        # both ways over every window: a 1 MiB request, a 2 MiB reply
        big = b"double" + bytes(range(256)) * 4096
        assert await unary(channel, ECHO, big) == big * 2


async def test_statuses_reach_grpclib() -> None:
    async with serving() as served:
        channel = served.channel
        with pytest.raises(GRPCError) as error:
            await unary(channel, FAIL, b"")
        assert error.value.status is grpclib.const.Status.NOT_FOUND
        assert error.value.message == "nö such thing, 100% sure"
        with pytest.raises(GRPCError) as error:
            await unary(channel, CRASH, b"")
        assert error.value.status is grpclib.const.Status.INTERNAL
        assert error.value.message == "internal error: ValueError"
        with pytest.raises(GRPCError) as error:
            await unary(channel, "/test.Lean/Missing", b"")
        assert error.value.status is grpclib.const.Status.UNIMPLEMENTED
        with pytest.raises(GRPCError) as error:
            await unary(channel, FAIL.replace("Fail", "Echo"), b"x" * (LIMIT + 1))
        assert error.value.status is grpclib.const.Status.RESOURCE_EXHAUSTED
        # and the connection serves on
        assert await unary(channel, ECHO, b"still") == b"still"


async def test_a_deadline_or_a_cancelled_call_cancels_the_handler() -> None:
    async with serving() as served:
        channel = served.channel
        handlers = served.handlers
        with pytest.raises((GRPCError, asyncio.TimeoutError)):
            await unary(channel, SLOW, b"", timeout=0.3)
        await asyncio.wait_for(handlers.cancelled.wait(), 5)
        handlers.cancelled.clear()
        handlers.started.clear()
        call = asyncio.ensure_future(unary(channel, SLOW, b"", timeout=None))
        await asyncio.wait_for(handlers.started.wait(), 5)
        call.cancel()  # grpclib resets the stream
        await asyncio.wait_for(handlers.cancelled.wait(), 5)
        assert await unary(channel, ECHO, b"after") == b"after"


async def test_a_server_stream_waits_for_the_clients_window() -> None:
    async with serving() as served:
        channel = served.channel
        async with channel.request(
            STREAM, grpclib.const.Cardinality.UNARY_STREAM, bytes, bytes
        ) as stream:
            await stream.send_message(b"40", end=True)
            got = [message async for message in stream]
        assert got == [str(i).encode() * 10_000 for i in range(40)]


@asynccontextmanager
async def reading_nothing(port: int, path: str, body: bytes) -> AsyncIterator[None]:
    """A client that makes one call granting the largest windows HTTP/2 allows, on a
    socket with a small receive buffer, and then reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    client = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding="utf-8"))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    client.increment_flow_control_window(2**31 - 1 - 65_535)
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path)]
    headers += [(":authority", "x"), ("te", "trailers"), ("content-type", "application/grpc")]
    client.send_headers(1, headers)
    client.send_data(1, framed(body), end_stream=True)
    await asyncio.get_running_loop().sock_sendall(sock, client.data_to_send())
    try:
        yield
    finally:
        sock.close()


async def test_a_stream_to_a_client_that_reads_nothing_waits_and_holds_little() -> None:
    async with serving() as served, reading_nothing(served.port, STREAM, b"100000"):
        handlers = served.handlers
        await asyncio.sleep(1.0)
        stalled = handlers.sent
        await asyncio.sleep(0.5)
        # The handler waits in drain(): nothing more is sent, and what waits in the
        # server for the client is about a write's worth, not the reply.
        assert handlers.sent == stalled < 1000
        (connection,) = served.server.connections.open
        assert isinstance(connection, GrpcConnection) and connection.transport is not None
        assert connection.transport.get_write_buffer_size() < 1024 * 1024


async def test_a_client_that_reads_nothing_is_dropped_past_max_unsent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        serving(Limits(max_unsent=1024 * 1024)) as served,
        reading_nothing(served.port, FLOOD, b"512"),
    ):
        # 32 MiB queued in one turn: far past what the socket takes, and the limit.
        await until(lambda: served.handlers.sent == 512 and not served.server.connections.open)
    assert "drops a connection from" in caplog.text
    assert "it does not read what it is sent" in caplog.text


async def test_stopping_the_server_ends_its_connections() -> None:
    async with serving() as served:
        channel = served.channel
        handlers = served.handlers
        server = served.server
        call = asyncio.ensure_future(unary(channel, SLOW, b"", timeout=None))
        await asyncio.wait_for(handlers.started.wait(), 5)
        await asyncio.wait_for(server.stop(), 5)
        # the client learns that its connection is gone (not a timeout of its own)
        with pytest.raises((StreamTerminatedError, GRPCError)):
            await asyncio.wait_for(call, 5)
        assert handlers.cancelled.is_set()


def test_grpcio_calls_it() -> None:
    grpc = pytest.importorskip("grpc")

    async def main() -> None:
        async with serving() as served:

            def call() -> None:
                with grpc.insecure_channel(f"{served.host}:{served.port}") as channel:
                    echo = channel.unary_unary(ECHO)
                    assert echo(b"from grpcio", timeout=10) == b"from grpcio"
                    big = b"double" + b"z" * 300_000
                    assert echo(big, timeout=10) == big * 2
                    with pytest.raises(grpc.RpcError) as error:
                        channel.unary_unary(FAIL)(b"", timeout=10)
                    assert error.value.code() == grpc.StatusCode.NOT_FOUND
                    assert error.value.details() == "nö such thing, 100% sure"

            await asyncio.to_thread(call)

    asyncio.run(main())


# --- the orchestrator on it (`http2="h2core"`) --------------------------------------------


def test_both_servers_take_either_http2_server_anywhere_and_no_other(certs: Certs) -> None:
    tls = ServerTls(cert=certs.server.cert, key=certs.server.key)
    for http2 in ("h2core", "grpclib"):
        OrchestratorConfig(http2=http2, host="0.0.0.0", insecure=True)
        OrchestratorConfig(http2=http2, tls=tls)
        AgentConfig(node_name="n1", http2=http2, tls=tls)
    assert OrchestratorConfig().http2 == AgentConfig(node_name="n1").http2 == "h2core"
    for config in (OrchestratorConfig, partial(AgentConfig, node_name="n1")):
        with pytest.raises(InvalidArgumentError, match="http2 must be one of h2core, grpclib"):
            config(http2="h3")


async def test_a_handoff_and_its_watch_on_the_orchestrator_on_h2core() -> None:
    async with Orchestrator(http2="h2core") as orch:
        async with (
            AsyncTimeSliceOrchestratorClient(orch.address, "a", "g", lease_ttl_sec=None) as a,
            AsyncTimeSliceOrchestratorClient(orch.address, "b", "g", lease_ttl_sec=None) as b,
        ):
            events: list[WatchEvent] = []

            async def watch() -> None:
                async for event in a.watch("g"):
                    events.append(event)

            watching = asyncio.ensure_future(watch())
            await a.acquire()
            waiting = asyncio.ensure_future(b.acquire())
            while "b" not in orch.table.groups["g"].queue:
                await asyncio.sleep(0.01)
            await a.release()
            await asyncio.wait_for(waiting, 10)
            assert orch.table.groups["g"].holder is not None
            assert orch.table.groups["g"].holder.job == "b"
            while not any(e.kind is WatchEventKind.GRANTED and e.job_id == "b" for e in events):
                await asyncio.sleep(0.01)
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        orch.table.validate()
