"""The gRPC server on our HTTP/2 connection, called by grpclib's client and by
grpcio's: calls, statuses, deadlines, cancellation, flow control and limits as
both clients expect them; and the orchestrator on it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NamedTuple

import grpclib.const
import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from benchmarks.common import RawCodec
from tests.certs import Certs
from timeslice import AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.api.h2serve import Call, CallError, H2Server, Route
from timeslice.client import WatchEvent, WatchEventKind
from timeslice.api.serving import listening_socket
from timeslice.errors import Code, InvalidArgumentError
from timeslice.orchestrator.config import OrchestratorConfig
from timeslice.security.tls import ServerTls

pytestmark = pytest.mark.timeout(60)

ECHO, FAIL, CRASH, SLOW, STREAM = (
    f"/test.Lean/{m}" for m in ("Echo", "Fail", "Crash", "Slow", "Stream")
)
LIMIT = 4 * 1024 * 1024


def framed(body: bytes) -> bytes:
    return b"\0" + len(body).to_bytes(4, "big") + body


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

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
            await call.drain()

    def routes(self) -> dict[str, Route]:
        return {
            ECHO: Route(self.echo),
            FAIL: Route(self.fail),
            CRASH: Route(self.crash),
            SLOW: Route(self.slow),
            STREAM: Route(self.stream),
        }


class Served(NamedTuple):
    host: str
    port: int
    handlers: Handlers
    server: H2Server
    channel: Channel  # a grpclib channel to it, closed at the end


@asynccontextmanager
async def serving() -> AsyncIterator[Served]:
    handlers = Handlers()
    server = H2Server(handlers.routes())
    sock = listening_socket("127.0.0.1", 0)
    await server.start(sock)
    host, port = "127.0.0.1", sock.getsockname()[1]
    channel = Channel(host, port, codec=RawCodec())
    try:
        yield Served(host, port, handlers, server, channel)
    finally:
        channel.close()
        await server.stop()


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


def test_the_orchestrator_takes_h2core_only_where_its_missing_limits_do_not_matter(
    certs: Certs,
) -> None:
    OrchestratorConfig(http2="h2core")  # loopback, no TLS
    OrchestratorConfig(http2="grpclib", host="0.0.0.0", insecure=True)
    for wrong in (
        {"http2": "h3"},
        {"http2": "h2core", "host": "0.0.0.0", "insecure": True},
        {"http2": "h2core", "tls": ServerTls(cert=certs.server.cert, key=certs.server.key)},
    ):
        with pytest.raises(InvalidArgumentError, match="http2"):
            OrchestratorConfig(**wrong)


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
