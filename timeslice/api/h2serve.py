"""A gRPC server on `timeslice.api.h2core`: the asyncio shell around its connection.

Each accepted connection is a `GrpcConnection` (an asyncio protocol) that feeds what
arrives to its `ServerConnection`, starts one task per request on the route its
`:path` names, and writes what the connection and its calls queued once per turn of
the event loop: a unary call's whole response (headers, message, trailers) and the
connection's own acknowledgements leave in one write.

A route's handler gets a `Call`: `recv` reads the request messages (each at most the
route's limit, checked from its 5-byte header before its body is read), `send`
queues reply messages already framed, `finish` ends the call with a gRPC status.
A handler that returns without `finish` ends the call OK; one that raises ends it
INTERNAL (a `CallError` with its own status). A client's deadline (`grpc-timeout`)
cancels the handler and answers DEADLINE_EXCEEDED; a reset stream or a lost
connection cancels it.

The server is held to `ConnectionLimits` as grpclib's is (`timeslice.api.connections`):
a connection over `max_connections` is answered RESOURCE_EXHAUSTED and closed, one
that sends no request headers within `header_timeout` or has no call open for
`idle_timeout` is closed. A peer that does not read holds little: a handler's
`drain` waits while the connection has more than `WRITE_HIGH_WATER` bytes queued or
the transport is paused, and a connection whose unread bytes pass `max_unsent`
is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from ssl import SSLContext
from typing import Any

from grpclib.metadata import encode_grpc_message

from timeslice.api.connections import (
    REFUSED_LINGER,
    Census,
    ConnectionLimits,
    warn_if_files_run_short,
)

from timeslice.api.h2core import (
    ConnectionClosed,
    DataReceived,
    ErrorCode,
    Limits,
    RequestReceived,
    ServerConnection,
    StreamEnded,
    StreamReset,
    StreamWritable,
)
from timeslice.api.header_blocks import header_block
from timeslice.errors import Code

log = logging.getLogger(__name__)

# Bytes a connection queues before a reply waits for them to be written (asyncio's
# own high-water mark for a transport's buffer).
WRITE_HIGH_WATER = 64 * 1024


class CallError(Exception):
    """Raised by a handler: the call ends with `code` and `message`."""

    def __init__(self, code: Code, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Route:
    """A method: the handler of its calls."""

    handler: Callable[[Call], Awaitable[None]]


_RESPONSE = header_block([(":status", "200"), ("content-type", "application/grpc")])
_OK = header_block([("grpc-status", "0")])
_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def status_block(
    code: Code,
    message: str,
    trailers: Sequence[tuple[str, str]] = (),
    trailers_only: bool = False,
) -> bytes:
    """The trailers that end a call with `code` and `trailers` besides (a whole
    response, if `trailers_only`)."""
    fields = [("grpc-status", str(int(code)))]
    if message:
        fields.append(("grpc-message", encode_grpc_message(message)))
    fields += trailers
    if trailers_only:
        fields = [(":status", "200"), ("content-type", "application/grpc"), *fields]
    return header_block(fields)


def grpc_timeout(value: str) -> float | None:
    """Seconds in a `grpc-timeout` header, or None if it is not one."""
    match = _TIMEOUT.fullmatch(value)
    return int(match.group(1)) * _UNITS[match.group(2)] if match else None


class Call:
    """One request on a connection, as its handler sees it."""

    def __init__(
        self,
        connection: GrpcConnection,
        stream_id: int,
        headers: list[tuple[str, str]],
        ended: bool,
    ) -> None:
        self._connection = connection
        self.stream_id = stream_id
        self.path = ""
        self.metadata: list[tuple[str, str]] = []
        for name, value in headers:
            if name == ":path":
                self.path = value
            elif not name.startswith(":"):
                self.metadata.append((name, value))
        self._buffer = bytearray()
        self._acknowledged = 0  # bytes at the buffer's front given back to the window
        self._ended = ended  # the client sent all of its side
        self._arrived = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._responded = False
        self.finished = False
        self._gone = False  # the stream is over from the client's side or the connection's

    def _abandon(self) -> None:
        self.finished = self._gone = True
        self._arrived.set()
        self._writable.set()

    @property
    def peer(self) -> Any:
        """The client's address (the socket's peer name)."""
        return self._connection.peer

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport (None once it is lost)."""
        return self._connection.transport

    @property
    def ended(self) -> bool:
        """Whether the client has sent all of its side: reading waits for nothing."""
        return self._ended

    # --- reading -----------------------------------------------------------------------

    def _feed(self, data: bytes, ended: bool) -> None:
        self._buffer += data
        self._ended = self._ended or ended
        self._arrived.set()

    async def recv(self, limit: int) -> bytes | None:
        """The next request message's body (None once the client ended its side),
        refused (RESOURCE_EXHAUSTED) once its header says it is over `limit` bytes."""
        header = await self._take(5)
        if header is None:
            return None
        if header[0]:
            raise CallError(Code.UNIMPLEMENTED, "compressed messages are not supported")
        size = int.from_bytes(header[1:5], "big")
        if size > limit:
            raise CallError(
                Code.RESOURCE_EXHAUSTED, f"message of {size} bytes is over the {limit}-byte limit"
            )
        body = await self._take(size)
        if body is None:
            raise CallError(Code.INVALID_ARGUMENT, "the message is truncated")
        return body

    async def _take(self, n: int) -> bytes | None:
        while len(self._buffer) < n:
            if self._ended:
                if self._buffer:
                    raise CallError(Code.INVALID_ARGUMENT, "the message is truncated")
                return None
            # `n` bytes are wanted (at most the route's limit): what has come of them
            # is given back to the window, so that a message larger than it comes in.
            self._acknowledge(len(self._buffer))
            self._arrived.clear()
            await self._arrived.wait()
        taken = bytes(self._buffer[:n])
        del self._buffer[:n]
        self._acknowledge(n)
        self._acknowledged -= n
        return taken

    def _acknowledge(self, upto: int) -> None:
        """Give the window back for the buffer's first `upto` bytes (once each)."""
        if upto > self._acknowledged:
            self._connection.consumed(self.stream_id, upto - self._acknowledged)
            self._acknowledged = upto

    # --- writing -----------------------------------------------------------------------

    def send(self, frames: bytes) -> None:
        """Queue reply messages, each with its 5-byte header; see `drain`."""
        if self._gone:
            return  # reset or disconnected: the handler is being cancelled
        if self.finished:
            raise RuntimeError("the call is over")
        connection = self._connection.h2
        if not self._responded:
            self._responded = True
            connection.respond(self.stream_id, _RESPONSE)
        if not connection.send_data(self.stream_id, frames):
            self._writable.clear()
        self._connection.wake()

    async def drain(self) -> None:
        """Wait until what `send` queued has gone out to the client's window, and
        the connection takes more (`GrpcConnection.drain`)."""
        await self._writable.wait()
        await self._connection.drain()

    def finish(
        self, code: Code = Code.OK, message: str = "", trailers: Sequence[tuple[str, str]] = ()
    ) -> None:
        """End the call with a status and any other `trailers` (the first call to
        it counts)."""
        if self.finished:
            return
        self.finished = True
        connection = self._connection.h2
        if not connection.is_open(self.stream_id):
            return
        if not self._responded:
            block = status_block(code, message, trailers, trailers_only=True)
            connection.respond(self.stream_id, block, end=True)
        elif code is Code.OK and not message and not trailers:
            connection.end(self.stream_id, _OK)
        else:
            connection.end(self.stream_id, status_block(code, message, trailers))
        self._connection.wake()


class GrpcConnection(asyncio.Protocol):
    """One client connection of `server`; see the module's docstring."""

    def __init__(self, server: H2Server) -> None:
        self._server = server
        self._routes = server.routes
        self._census = server.connections
        self.h2 = ServerConnection(server.h2_limits)
        self.transport: asyncio.Transport | None = None
        self._calls: dict[int, tuple[Call, asyncio.Task[None]]] = {}
        self._waking = False
        self.peer: Any = None
        self.closed = asyncio.Event()
        # Set while the transport takes more (asyncio's pause_writing and
        # resume_writing), and once what was queued has been written.
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._written = asyncio.Event()
        self.refused = False  # over the server's connection limit
        self._timer: asyncio.TimerHandle | None = None
        self._lingering = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.refused = not self._census.admit(self)
        self._arm(self._census.limits.header_timeout, "no request headers in time")
        self.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._census.open.discard(self)
        self._server.lost(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._abandon_all()
        self._flowing.set()
        self._written.set()
        self.closed.set()

    def pause_writing(self) -> None:
        self._flowing.clear()

    def resume_writing(self) -> None:
        self._flowing.set()

    async def drain(self) -> None:
        """Wait while the connection holds too much for its client: once a write's
        worth is queued, until it is written; while the transport's buffer is over
        its high-water mark, until the client has read some. A reply smaller than
        that goes on at once, and leaves with the rest of its turn in one write."""
        if self.h2.unsent >= WRITE_HIGH_WATER:
            await self._written.wait()
        await self._flowing.wait()

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive(data):
            match event:
                case RequestReceived(stream_id=sid, headers=headers, ended=ended):
                    if self.refused:
                        self._refuse(sid)
                    else:
                        self._start(sid, headers, ended)
                case DataReceived(stream_id=sid, data=body, ended=ended):
                    if (entry := self._calls.get(sid)) is not None:
                        entry[0]._feed(body, ended)
                case StreamEnded(stream_id=sid):
                    if (entry := self._calls.get(sid)) is not None:
                        entry[0]._feed(b"", True)
                case StreamReset(stream_id=sid):
                    if (entry := self._calls.pop(sid, None)) is not None:
                        entry[0]._abandon()
                        entry[1].cancel()
                        self._ended_call()
                case StreamWritable(stream_id=sid):
                    if (entry := self._calls.get(sid)) is not None:
                        entry[0]._writable.set()
                case ConnectionClosed():
                    pass  # written and closed by `_write`
                case _:
                    raise TypeError(f"not an event: {event!r}")
        self.wake()

    def consumed(self, stream_id: int, n: int) -> None:
        self.h2.consumed(stream_id, n)
        self.wake()

    def wake(self) -> None:
        """Write what is queued at the end of this turn of the loop (once)."""
        if not self._waking:
            self._waking = True
            self._written.clear()
            asyncio.get_running_loop().call_soon(self._write)

    def _write(self) -> None:
        self._waking = False
        self._written.set()
        transport = self.transport
        if transport is None:
            return
        if data := self.h2.data_to_send():
            transport.write(data)
            # The client's windows bound what the streams send, but a client may grant
            # huge ones and read nothing: the transport's buffer is bounded too.
            if transport.get_write_buffer_size() > self.h2.limits.max_unsent:
                log.warning(
                    "%s drops a connection from %s: it does not read what it is sent",
                    self._census.what,
                    self.peer,
                )
                transport.abort()
                return
        if self.h2.closed is not None:
            transport.close()

    def close(self, reason: str = "") -> None:
        """End the connection (GOAWAY); the calls under way are cancelled."""
        self.h2.close(ErrorCode.NO_ERROR, reason)
        self._abandon_all()
        self.wake()

    def _abandon_all(self) -> None:
        calls, self._calls = self._calls, {}
        for call, task in calls.values():
            call._abandon()
            task.cancel()

    # --- the server's limits ------------------------------------------------------------

    def _arm(self, delay: float, why: str) -> None:
        """Close the connection `delay` seconds from now, unless disarmed first."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire, why)

    def _disarm(self) -> None:
        if self._timer is not None and not self._lingering:
            self._timer.cancel()
            self._timer = None

    def _expire(self, why: str) -> None:
        self._timer = None
        if self.transport is not None:
            log.debug("%s closes a connection from %s: %s", self._census.what, self.peer, why)
            self.close(f"connection closed: {why}")

    def _ended_call(self) -> None:
        """A call is over: with none left, the connection is idle."""
        if not self._calls and self._timer is None and self.transport is not None:
            self._arm(self._census.limits.idle_timeout, "idle")

    def _refuse(self, stream_id: int) -> None:
        """Answer a request on a connection over the limit, without running it, and
        close the connection a little later (once its peer has read the answer)."""
        block = status_block(Code.RESOURCE_EXHAUSTED, self._census.refusal, trailers_only=True)
        self.h2.respond(stream_id, block, end=True)
        if not self._lingering:
            self._arm(REFUSED_LINGER, "refused")
            self._lingering = True

    # --- calls --------------------------------------------------------------------------

    def _start(self, stream_id: int, headers: list[tuple[str, str]], ended: bool) -> None:
        self._disarm()
        call = Call(self, stream_id, headers, ended)
        route = self._routes.get(call.path)
        problem = _refusal(call, headers, route)
        if problem is not None:
            call.finish(*problem)
            self._ended_call()
            return
        assert route is not None
        timeout = next((grpc_timeout(v) for n, v in call.metadata if n == "grpc-timeout"), None)
        task = asyncio.get_running_loop().create_task(self._run(call, route, timeout))
        self._calls[stream_id] = (call, task)

    async def _run(self, call: Call, route: Route, timeout: float | None) -> None:
        try:
            try:
                if timeout is None:
                    await route.handler(call)
                else:
                    async with asyncio.timeout(timeout):
                        await route.handler(call)
            except TimeoutError:
                call.finish(Code.DEADLINE_EXCEEDED, "the deadline passed")
            except CallError as exc:
                call.finish(exc.code, exc.message)
            except asyncio.CancelledError:
                call.finish(Code.CANCELLED, "the call was cancelled")
                raise
            except Exception as exc:
                log.exception("%s failed", call.path)
                call.finish(Code.INTERNAL, f"internal error: {type(exc).__name__}")
            else:
                call.finish()
        finally:
            if self._calls.pop(call.stream_id, None) is not None:
                self._ended_call()


def _refusal(
    call: Call, headers: list[tuple[str, str]], route: Route | None
) -> tuple[Code, str] | None:
    """Why a request is answered with an error before any handler runs, or None."""
    method = next((v for n, v in headers if n == ":method"), "")
    if method != "POST":
        return Code.UNIMPLEMENTED, f"method {method} is not POST"
    kind = next((v for n, v in headers if n == "content-type"), "")
    if not (
        kind == "application/grpc" or kind.startswith(("application/grpc+", "application/grpc;"))
    ):
        return Code.UNKNOWN, f"content-type {kind or '(none)'} is not gRPC's"
    if route is None:
        return Code.UNIMPLEMENTED, f"method not found: {call.path}"
    return None


class H2Server:
    """Listens, makes a `GrpcConnection` of each client, holds them to `limits`
    (`timeslice.api.connections`; `what` names the server in what it answers), and
    closes them all on `stop`. `h2` bounds each connection's HTTP/2 (its
    `max_streams` is `limits.max_streams`)."""

    def __init__(
        self,
        routes: dict[str, Route],
        limits: ConnectionLimits | None = None,
        what: str = "the server",
        h2: Limits | None = None,
    ) -> None:
        self.routes = routes
        self.connections = Census(limits or ConnectionLimits(), what)
        self.h2_limits = replace(h2 or Limits(), max_streams=self.connections.limits.max_streams)
        self._server: asyncio.Server | None = None
        self._accepted: set[GrpcConnection] = set()  # the refused ones too

    def _protocol(self) -> GrpcConnection:
        connection = GrpcConnection(self)
        self._accepted.add(connection)
        return connection

    def lost(self, connection: GrpcConnection) -> None:
        self._accepted.discard(connection)

    async def start(self, sock: socket.socket, ssl: SSLContext | None = None) -> None:
        """Serve on the listening `sock` (over TLS with `ssl`: a handshake is bounded
        by the header timeout, for a connection under way is not counted yet)."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        self._server = await asyncio.get_running_loop().create_server(
            self._protocol,
            sock=sock,
            ssl=ssl,
            ssl_handshake_timeout=None if ssl is None else self.connections.limits.header_timeout,
        )
        warn_if_files_run_short(self.connections.limits, self.connections.what)

    async def stop(self) -> None:
        """Stop listening, cancel what still runs, and close every connection."""
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._accepted):
            connection.close("the server is closing")
        await self._server.wait_closed()
        self._server = None
