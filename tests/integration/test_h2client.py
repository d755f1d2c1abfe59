"""Unary calls through `H2Channel`, to our HTTP/2 server and to grpclib's, over TCP,
TLS and a Unix socket: answers, statuses, deadlines, cancellation, a refused call
sent again, a closed connection made again; and a server that answers what no
gRPC server should gets a clean error, never a hung or broken client."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import h2.config
import h2.errors
import h2.exceptions
import h2.connection
import h2.events
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from benchmarks.common import ECHO_ROUTE, echo_server
from tests.certs import Certs
from tests.integration.test_h2serve import CRASH, ECHO, FAIL, LIMIT, SLOW, serving, until
from timeslice.api.connections import ConnectionLimits
from timeslice.api.h2client import H2Channel, StatusError, grpc_timeout
from timeslice.api.h2serve import H2Server
from timeslice.api.serving import listening_socket
from timeslice.api.gen.timeslice_orchestrator.v1alpha1 import AcquireRequest
from timeslice.security.tls import ClientTls, ServerTls

pytestmark = pytest.mark.timeout(60)


def test_grpc_timeout_values() -> None:
    assert grpc_timeout(0.0001) == "1m"
    assert grpc_timeout(1.5) == "1500m"
    assert grpc_timeout(10**6) == "1000000S"
    assert grpc_timeout(10**9) == "99999999S"


async def test_calls_one_after_another_at_once_and_over_every_window() -> None:
    async with serving() as served:
        channel = H2Channel(served.host, served.port)
        try:
            for i in range(50):
                assert await channel.unary(ECHO, b"n%d" % i, 10) == b"n%d" % i
            replies = await asyncio.gather(
                *(channel.unary(ECHO, b"c%d" % i, 10) for i in range(150))  # > max_streams
            )
            assert replies == [b"c%d" % i for i in range(150)]
            big = b"double" + bytes(range(256)) * 4096  # 1 MiB out, 2 MiB back
            assert await channel.unary(ECHO, big, 10) == big * 2
            assert await channel.unary(ECHO, b"", None) == b""
            assert len(served.server.connections.open) == 1  # all of it on one connection
        finally:
            channel.close()


async def test_statuses_come_back_as_grpclib_raises_them() -> None:
    async with serving() as served:
        channel = H2Channel(served.host, served.port)
        try:
            with pytest.raises(GRPCError) as error:
                await channel.unary(FAIL, b"", 10)
            assert error.value.status is Status.NOT_FOUND
            assert error.value.message == "nö such thing, 100% sure"
            with pytest.raises(GRPCError) as error:
                await channel.unary(CRASH, b"", 10)
            assert error.value.status is Status.INTERNAL
            with pytest.raises(GRPCError) as error:
                await channel.unary("/test.Lean/Missing", b"", 10)
            assert error.value.status is Status.UNIMPLEMENTED
            with pytest.raises(GRPCError) as error:
                await channel.unary(ECHO, b"x" * (LIMIT + 1), 10)
            assert error.value.status is Status.RESOURCE_EXHAUSTED
            assert await channel.unary(ECHO, b"still", 10) == b"still"
        finally:
            channel.close()


async def test_an_answer_over_the_limit_is_refused_and_the_connection_goes_on() -> None:
    async with serving() as served:
        channel = H2Channel(served.host, served.port, max_reply=1000)
        try:
            with pytest.raises(GRPCError) as error:
                await channel.unary(ECHO, b"double" + bytes(600), 10)
            assert error.value.status is Status.RESOURCE_EXHAUSTED
            assert await channel.unary(ECHO, bytes(1000), 10) == bytes(1000)
        finally:
            channel.close()


async def test_a_deadline_or_a_cancel_resets_the_stream_and_cancels_the_handler() -> None:
    async with serving() as served:
        channel = H2Channel(served.host, served.port)
        handlers = served.handlers
        try:
            with pytest.raises(TimeoutError):
                await channel.unary(SLOW, b"", 0.3)
            await asyncio.wait_for(handlers.cancelled.wait(), 5)
            handlers.cancelled.clear()
            handlers.started.clear()
            call = asyncio.ensure_future(channel.unary(SLOW, b"", None))
            await asyncio.wait_for(handlers.started.wait(), 5)
            call.cancel()
            await asyncio.wait_for(handlers.cancelled.wait(), 5)
            assert await channel.unary(ECHO, b"after", 10) == b"after"
        finally:
            channel.close()


async def test_a_connection_the_server_closed_is_made_again() -> None:
    limits = ConnectionLimits(idle_timeout=0.2)
    async with serving() as served:
        server = H2Server(served.server.routes, limits=limits)
        sock = listening_socket("127.0.0.1", 0)
        await server.start(sock)
        channel = H2Channel("127.0.0.1", sock.getsockname()[1])
        try:
            assert await channel.unary(ECHO, b"one", 10) == b"one"
            await until(lambda: not server.connections.open)  # closed when idle
            assert await channel.unary(ECHO, b"two", 10) == b"two"
        finally:
            channel.close()
            await server.stop()


async def test_a_server_that_is_not_there_is_a_connection_error() -> None:
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    channel = H2Channel("127.0.0.1", port)
    with pytest.raises(ConnectionError):
        await channel.unary(ECHO, b"", 5)
    channel.close()
    with pytest.raises(ConnectionError, match="closed"):
        await channel.unary(ECHO, b"", 5)


async def test_grpclibs_server_answers_it() -> None:
    request = bytes(AcquireRequest(job_id="a", group_id="g"))
    async with echo_server() as address:
        host, port = address.rsplit(":", 1)
        channel = H2Channel(host, int(port))
        try:
            answers = await asyncio.gather(
                *(channel.unary(ECHO_ROUTE, request, 10) for _ in range(20))
            )
            assert answers == [request] * 20
        finally:
            channel.close()


async def test_over_tls_and_a_unix_socket(certs: Certs) -> None:
    async with serving() as served:
        tls_server = H2Server(served.server.routes)
        sock = listening_socket("127.0.0.1", 0)
        await tls_server.start(
            sock, ssl=ServerTls(cert=certs.server.cert, key=certs.server.key).context()
        )
        port = sock.getsockname()[1]
        trusted = H2Channel("127.0.0.1", port, ssl=ClientTls(ca=certs.ca).context())
        untrusted = H2Channel("127.0.0.1", port, ssl=ClientTls(ca=certs.other_ca).context())
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "h2.sock")
        unix_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix_sock.bind(path)
        unix_sock.listen(16)
        unix_sock.setblocking(False)
        unix_server = H2Server(served.server.routes)
        await unix_server.start(unix_sock)
        local = H2Channel("", 0, path=path)
        try:
            assert await trusted.unary(ECHO, b"secret", 10) == b"secret"
            with pytest.raises(ssl.SSLCertVerificationError):
                await untrusted.unary(ECHO, b"", 10)
            assert await local.unary(ECHO, b"local", 10) == b"local"
        finally:
            for channel in (trusted, untrusted, local):
                channel.close()
            await tls_server.stop()
            await unix_server.stop()
            os.unlink(path)
            os.rmdir(folder)


# --- a server that answers as told: h2's server connection on a socket ------------------


Answer = Callable[[h2.connection.H2Connection, int, int], None]


@dataclass
class Fake:
    port: int
    channel: H2Channel  # to it, closed at the end
    made: list[int] = field(default_factory=list)  # the connections, numbered from 0


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handle: Handler) -> AsyncIterator[int]:
    """A TCP server of `handle`s on a loopback port (yielded); at the end every
    connection still open is closed, which ends its handler's reads."""
    running: set[tuple[asyncio.Task[None], asyncio.StreamWriter]] = set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        running.add((task, writer))
        try:
            await handle(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for _, writer in running:
            writer.transport.abort()
        await asyncio.wait_for(
            asyncio.gather(*(task for task, _ in running), return_exceptions=True), 5
        )
        await server.wait_closed()


@asynccontextmanager
async def fake_server(answer: Answer) -> AsyncIterator[Fake]:
    """A server that calls `answer(connection, stream_id, nth_connection)` on each
    request it has read whole."""
    made: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nth = len(made)
        made.append(nth)
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False, validate_outbound_headers=False, header_encoding="utf-8"
            )
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        answer(conn, event.stream_id, nth)
                writer.write(conn.data_to_send())
        except (h2.exceptions.ProtocolError, ConnectionError):
            pass

    async with raw_server(handle) as port:
        fake = Fake(port, H2Channel("127.0.0.1", port), made)
        try:
            yield fake
        finally:
            fake.channel.close()


GRPC = [(":status", "200"), ("content-type", "application/grpc")]


def answers(headers: list[tuple[str, str]], body: bytes, trailers: list[tuple[str, str]]) -> Answer:
    def answer(conn: h2.connection.H2Connection, sid: int, nth: int) -> None:
        conn.send_headers(sid, headers, end_stream=not body and not trailers)
        if body:
            conn.send_data(sid, body, end_stream=not trailers)
        if trailers:
            conn.send_headers(sid, trailers, end_stream=True)

    return answer


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (answers([(":status", "503")], b"", []), Status.UNAVAILABLE),
        (answers([(":status", "200"), ("content-type", "text/html")], b"", []), Status.UNKNOWN),
        (answers(GRPC, b"\0\0\0\0\x01x", [("grpc-status", "oops")]), Status.UNKNOWN),
        (answers(GRPC, b"\1\0\0\0\x01x", [("grpc-status", "0")]), Status.INTERNAL),
        (answers(GRPC, b"\0\0\0\0\x01xy", [("grpc-status", "0")]), Status.INTERNAL),
        (answers(GRPC, b"", [("grpc-status", "0")]), Status.INTERNAL),
        (answers([*GRPC, ("grpc-status", "14")], b"", []), Status.UNAVAILABLE),
    ],
)
async def test_an_answer_that_is_not_good_grpc_is_an_error(answer: Answer, status: Status) -> None:
    async with fake_server(answer) as fake:
        with pytest.raises(GRPCError) as error:
            await fake.channel.unary(ECHO, b"", 5)
        assert error.value.status is status


async def test_a_call_the_server_refused_unprocessed_is_sent_again_once() -> None:
    def refuse_on_the_first_connection(
        conn: h2.connection.H2Connection, sid: int, nth: int
    ) -> None:
        if nth == 0:
            conn.close_connection(last_stream_id=0)  # GOAWAY NO_ERROR: nothing processed
        else:
            answers(GRPC, b"\0\0\0\0\x02ok", [("grpc-status", "0")])(conn, sid, nth)

    async with fake_server(refuse_on_the_first_connection) as fake:
        assert await fake.channel.unary(ECHO, b"", 5) == b"ok"
        assert fake.made == [0, 1]

    def always_refuse(conn: h2.connection.H2Connection, sid: int, nth: int) -> None:
        conn.reset_stream(sid, error_code=h2.errors.ErrorCodes.REFUSED_STREAM)

    async with fake_server(always_refuse) as fake:
        with pytest.raises(ConnectionError, match="refused the call twice"):
            await fake.channel.unary(ECHO, b"", 5)


async def test_a_reset_or_a_broken_server_fails_the_call_not_the_client() -> None:
    def reset(conn: h2.connection.H2Connection, sid: int, nth: int) -> None:
        conn.reset_stream(sid, error_code=h2.errors.ErrorCodes.INTERNAL_ERROR)

    async with fake_server(reset) as fake:
        with pytest.raises(StreamTerminatedError, match="INTERNAL_ERROR"):
            await fake.channel.unary(ECHO, b"", 5)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await reader.read(65536)

    async with raw_server(garbage) as port:
        channel = H2Channel("127.0.0.1", port)
        try:
            with pytest.raises(ConnectionError):
                await channel.unary(ECHO, b"", 5)
        finally:
            channel.close()


async def test_a_server_that_never_answers_runs_into_the_deadline() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):  # read all, answer nothing
            pass

    async with raw_server(silent) as port:
        channel = H2Channel("127.0.0.1", port)
        try:
            with pytest.raises(TimeoutError):
                await channel.unary(ECHO, b"", 0.3)
        finally:
            channel.close()


async def test_pings_keep_a_long_call_and_leave_a_server_that_stops_answering() -> None:
    async with serving() as served:  # our server answers pings while the call waits
        channel = H2Channel(served.host, served.port, pings=(0.05, 0.3))
        try:
            with pytest.raises(TimeoutError):  # not dropped: every ping was answered
                await channel.unary(SLOW, b"", 0.8)
        finally:
            channel.close()

    async def frozen(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):  # takes the request, answers not even a ping
            pass

    async with raw_server(frozen) as port:
        channel = H2Channel("127.0.0.1", port, pings=(0.05, 0.2))
        started = asyncio.get_running_loop().time()
        try:
            with pytest.raises(ConnectionError, match="answered no ping for 0.2 s"):
                await channel.unary(ECHO, b"", None)  # no deadline: only the pings end it
            assert asyncio.get_running_loop().time() - started < 2
        finally:
            channel.close()


async def test_a_refusal_keeps_its_trailers() -> None:
    refusal = [("grpc-status", "14"), ("grpc-message", "a standby"), ("timeslice-active", "h:1")]
    async with fake_server(answers(GRPC, b"", refusal)) as fake:
        with pytest.raises(StatusError) as error:
            await fake.channel.unary(ECHO, b"", 5)
        assert error.value.status is Status.UNAVAILABLE
        assert error.value.message == "a standby"
        assert ("timeslice-active", "h:1") in error.value.trailers
