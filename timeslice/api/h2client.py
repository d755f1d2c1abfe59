"""Unary gRPC calls on `timeslice.api.h2core`: the asyncio shell of its client side.

An `H2Channel` keeps one connection to a server (TCP, TLS or a Unix socket),
opened on the first call and again after it closes, and sends each call as one
stream: its headers, its message and the end of the stream leave in the write that
the event loop's turn makes, with every other call queued in the same turn. The
answer is read as the server's side reads a request: one message at most
`max_reply` bytes, uncompressed, then the trailers' status.

What a call raises is what grpclib's client raises for the same event, so that the
callers' error mapping (`timeslice.client._transport.map_errors`) takes both:
`GRPCError` for a status other than OK (or an answer that is not gRPC),
`StreamTerminatedError` for a stream the server reset, `ConnectionError` for a
connection that closed or could not be made, `TimeoutError` when the call's time
ran out (its stream is reset then, and the server's handler cancelled). A call the
server refused unprocessed (REFUSED_STREAM, or above the last stream its GOAWAY
names) is sent again once, on a new connection. A status other than OK comes as a
`StatusError`, a `GRPCError` that keeps the answer's trailers (a standby names the
active in them).

With `pings=(every, timeout)`, a connection with a call open is pinged every
`every` seconds and dropped (its socket aborted, its calls failing with
`ConnectionError`) when a ping is unanswered for `timeout` seconds: a server that
stops answering altogether (frozen, cut off, its TCP connection left open) is left
within their sum, even by a call that waits long by design (a blocked Acquire).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from ssl import SSLContext

from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.metadata import decode_grpc_message

from timeslice.api.h2core import (
    ClientConnection,
    ConnectionClosed,
    DataReceived,
    ErrorCode,
    Limits,
    PingAcknowledged,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    code_name,
)
from timeslice.api.header_blocks import header_block

#: The largest answer a call takes (its message's bytes).
MAX_REPLY = 16 * 1024 * 1024
# Bytes queued on the transport before a new call waits for them to be written.
WRITE_HIGH_WATER = 64 * 1024
_STATUSES = {s.value: s for s in Status}
# HTTP statuses a gRPC client reads as a gRPC status (gRPC's HTTP-to-gRPC mapping).
_BY_HTTP = {
    400: Status.INTERNAL,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.UNIMPLEMENTED,
    429: Status.UNAVAILABLE,
    502: Status.UNAVAILABLE,
    503: Status.UNAVAILABLE,
    504: Status.UNAVAILABLE,
}


class _Refused(Exception):
    """The server did not process the call: it may be sent again."""


class StatusError(GRPCError):
    """A status other than OK, with the answer's trailers (or its trailers-only
    headers)."""

    def __init__(self, status: Status, message: str | None, trailers: list[tuple[str, str]]):
        super().__init__(status, message)
        self.trailers = trailers


class _Call:
    """One call's answer as it arrives."""

    __slots__ = ("done", "body", "status", "message", "metadata", "max_reply")

    def __init__(self, max_reply: int) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.body = bytearray()
        self.status: Status | None = None
        self.message = ""
        self.metadata: list[tuple[str, str]] = []  # the trailers that ended it
        self.max_reply = max_reply

    def fail(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)

    def headers(self, headers: list[tuple[str, str]], ended: bool) -> None:
        """The response's headers (all of it when `ended`: trailers only)."""
        status = headers[0][1]  # h2core checked that `:status` comes first
        if status != "200":
            code = int(status) if status.isdigit() else 0
            self.fail(GRPCError(_BY_HTTP.get(code, Status.UNKNOWN), f"HTTP status {status}"))
            return
        kind = next((v for n, v in headers if n == "content-type"), "")
        if not kind.startswith("application/grpc"):
            self.fail(GRPCError(Status.UNKNOWN, f"not a gRPC answer (content-type {kind!r})"))
            return
        if ended:
            self.trailers(headers)

    def data(self, data: bytes) -> bool:
        """Body bytes; False (the call failed) once they are more than a message's."""
        self.body += data
        if len(self.body) <= 5 + self.max_reply:
            return True
        self.fail(
            GRPCError(Status.RESOURCE_EXHAUSTED, f"the answer is over {self.max_reply} bytes")
        )
        return False

    def trailers(self, headers: list[tuple[str, str]]) -> None:
        values = dict(headers)
        raw = values.get("grpc-status", "")
        if not raw.isdigit() or int(raw) not in _STATUSES:
            self.fail(GRPCError(Status.UNKNOWN, f"the answer has no valid grpc-status ({raw!r})"))
            return
        self.status = _STATUSES[int(raw)]
        self.message = decode_grpc_message(values.get("grpc-message", ""))
        self.metadata = headers
        if not self.done.done():
            self.done.set_result(None)

    def reply(self) -> bytes:
        """The answer's message, once the call is done; GRPCError for a status that
        is not OK or a body that is not one uncompressed message."""
        if self.status is not Status.OK:
            assert self.status is not None
            raise StatusError(self.status, self.message or None, self.metadata)
        body = self.body
        if len(body) < 5:
            raise GRPCError(Status.INTERNAL, "the answer has no message")
        if body[0] != 0:
            raise GRPCError(Status.INTERNAL, "the answer is compressed, which was not asked for")
        if int.from_bytes(body[1:5], "big") != len(body) - 5:
            raise GRPCError(Status.INTERNAL, "the answer is not one whole message")
        return bytes(body[5:])


class _Link(asyncio.Protocol):
    """One connection: its `ClientConnection` and the calls open on it."""

    def __init__(self, limits: Limits, pings: tuple[float, float] | None = None) -> None:
        self.h2 = ClientConnection(limits)
        self._pings = pings
        self._ping_timer: asyncio.TimerHandle | None = None
        self._pings_sent = 0
        self._ping_sent = 0  # the number of the ping unanswered (0: none)
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, _Call] = {}
        self.lost: BaseException | None = None  # set once it may take no call
        self._loop = asyncio.get_running_loop()
        self._write_due = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def usable(self) -> bool:
        return self.lost is None and self.h2.accepts_requests

    # --- asyncio's side -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._write()

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive(data):
            if isinstance(event, DataReceived):
                call = self.calls.get(event.stream_id)
                if call is not None:
                    self.h2.consumed(event.stream_id, len(event.data))
                    if not call.data(event.data):
                        self._drop(event.stream_id)
            elif isinstance(event, ResponseReceived):
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.headers(event.headers, event.ended)
                    if call.done.done():
                        self._drop(event.stream_id)
            elif isinstance(event, TrailersReceived):
                if (call := self.calls.pop(event.stream_id, None)) is not None:
                    call.trailers(event.headers)
            elif isinstance(event, StreamReset):
                if (call := self.calls.pop(event.stream_id, None)) is not None:
                    call.fail(_reset_error(event.code))
            elif isinstance(event, PingAcknowledged):
                if self._ping_sent and event.payload == self._ping_sent.to_bytes(8, "big"):
                    self._ping_sent = 0
                    self._arm_ping()
            elif isinstance(event, ConnectionClosed):
                self._close(ConnectionError(f"the server closed the connection: {event.reason}"))
        self._room.set()
        self._write()
        if not self.h2.accepts_requests and not self.calls:
            self._close(ConnectionError("the connection is over"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._close(
            ConnectionError(f"the connection closed: {exc}" if exc else "the connection closed")
        )
        self._writable.set()
        self._room.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- the calls' side ----------------------------------------------------------------

    async def call(self, block: bytes, message: bytes, max_reply: int) -> bytes:
        """Send one request (headers `block`, framed `message`) and wait for its answer."""
        while self.usable and not self.h2.has_room:
            self._room.clear()
            await self._room.wait()
        while self.usable and not self._writable.is_set():
            await self._writable.wait()
        if self.lost is not None or not self.h2.accepts_requests:
            raise _Refused()
        call = _Call(max_reply)
        stream_id = self.h2.request(block, message)
        self.calls[stream_id] = call
        if self._ping_timer is None:
            self._arm_ping()
        if not self._write_due:
            self._write_due = True
            self._loop.call_soon(self._write)
        try:
            await call.done
        except BaseException:
            # Cancelled or timed out: the server need not go on with it.
            if self.calls.pop(stream_id, None) is not None:
                self.h2.cancel(stream_id)
                self._write()
            raise
        return call.reply()

    # --- pings while a call is open ------------------------------------------------------

    def _arm_ping(self) -> None:
        """The next ping in `every` seconds, while a call is open."""
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        if self._pings is not None and self.lost is None and self.calls:
            self._ping_timer = self._loop.call_later(self._pings[0], self._ping)

    def _ping(self) -> None:
        self._ping_timer = None
        if self._pings is None or self.lost is not None or not self.calls:
            return  # pinged again with the next call
        self._pings_sent += 1
        self._ping_sent = self._pings_sent
        self.h2.ping(self._ping_sent.to_bytes(8, "big"))
        self._write()
        self._ping_timer = self._loop.call_later(self._pings[1], self._unanswered)

    def _unanswered(self) -> None:
        """A ping got no answer in time: the server is gone; drop the connection at
        once (a TLS close would wait for a frozen peer's close_notify)."""
        self._ping_timer = None
        assert self._pings is not None
        self._close(ConnectionError(f"the server answered no ping for {self._pings[1]:g} s"))
        if self.transport is not None:
            self.transport.abort()

    def _drop(self, stream_id: int) -> None:
        """A call given up before its stream ended: reset the stream."""
        self.calls.pop(stream_id, None)
        self.h2.cancel(stream_id)

    def _write(self) -> None:
        self._write_due = False
        data = self.h2.data_to_send()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)
        if self.lost is not None and transport is not None:
            transport.close()

    def _close(self, error: BaseException) -> None:
        if self.lost is None:
            self.lost = error
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.fail(error)
        if self.transport is not None and not self.transport.is_closing():
            if self.h2.closed is None:
                self.h2.close()
            self._write()

    def close(self) -> None:
        self._close(ConnectionError("the channel is closed"))
        if self.transport is not None:
            self.transport.close()


def _retrieved(future: asyncio.Future[_Link]) -> None:
    if not future.cancelled():
        future.exception()


def _reset_error(code: int) -> BaseException:
    if code == ErrorCode.REFUSED_STREAM:
        return _Refused()
    return StreamTerminatedError(f"the stream was reset ({code_name(code)})")


def grpc_timeout(seconds: float) -> str:
    """A `grpc-timeout` value for `seconds` (rounded up to the millisecond, at most
    eight digits of a unit)."""
    ms = max(1, math.ceil(seconds * 1000))
    if ms < 10**8:
        return f"{ms}m"
    return f"{min(10**8 - 1, math.ceil(ms / 1000))}S"


class H2Channel:
    """Unary calls to one server; see the module's docstring.

    `host`/`port` or `path` (a Unix socket) name it; `ssl` (a client context with
    ALPN h2) puts the connection on TLS, checking `server_hostname` (default `host`);
    `metadata` goes with every call (the bearer token); `pings`: see the module."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        path: str | None = None,
        ssl: SSLContext | None = None,
        server_hostname: str | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        limits: Limits | None = None,
        max_reply: int = MAX_REPLY,
        pings: tuple[float, float] | None = None,
    ) -> None:
        self._host, self._port, self._path = host, port, path
        self._pings = pings
        self._ssl = ssl
        self._server_hostname = server_hostname
        self._limits = limits or Limits()
        self._max_reply = max_reply
        if path is not None:
            authority = "localhost"
        else:
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._fixed = [
            (":method", "POST"),
            (":scheme", "https" if ssl is not None else "http"),
            (":authority", authority),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            *metadata,
        ]
        self._blocks: dict[str, bytes] = {}
        self._link: _Link | None = None
        self._connecting: asyncio.Future[_Link] | None = None
        self._closed = False

    async def unary(self, path: str, request: bytes, timeout: float | None) -> bytes:
        """The answer's message to `request` (encoded) sent to method `path`."""
        if self._closed:
            raise ConnectionError("the channel is closed")
        message = b"\x00" + len(request).to_bytes(4, "big") + request
        async with asyncio.timeout(timeout):
            block = self._block(path)
            if timeout is not None:
                block += header_block([("grpc-timeout", grpc_timeout(timeout))])
            for attempt in range(2):
                link = await self._connected()
                try:
                    return await link.call(block, message, self._max_reply)
                except _Refused:
                    if attempt:
                        raise ConnectionError("the server refused the call twice") from None
        raise AssertionError("unreachable")

    async def connect(self) -> None:
        """Make the connection now, if it is not made (OSError if it cannot be)."""
        if self._closed:
            raise ConnectionError("the channel is closed")
        await self._connected()

    def _block(self, path: str) -> bytes:
        """The constant part of `path`'s request headers, encoded once."""
        block = self._blocks.get(path)
        if block is None:
            if len(self._blocks) >= 256:
                self._blocks.clear()
            fields = [self._fixed[0], self._fixed[1], (":path", path), *self._fixed[2:]]
            block = self._blocks[path] = header_block(fields)
        return block

    async def _connected(self) -> _Link:
        link = self._link
        if link is not None and link.usable:
            return link
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            # Read even when every caller gave up waiting (its timeout ran out).
            self._connecting.add_done_callback(_retrieved)
        connecting = self._connecting
        try:
            # Shielded: one caller's timeout does not end the others' connection.
            link = await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None
        return link

    async def _connect(self) -> _Link:
        loop = asyncio.get_running_loop()
        limits, pings = self._limits, self._pings
        if self._path is not None:
            _, link = await loop.create_unix_connection(lambda: _Link(limits, pings), self._path)
        else:
            hostname = (self._server_hostname or self._host) if self._ssl is not None else None
            _, link = await loop.create_connection(
                lambda: _Link(limits, pings),
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=hostname,
            )
        if self._closed:
            link.close()
            raise ConnectionError("the channel is closed")
        if self._link is not None and self._link is not link:
            old = self._link
            if not old.calls:
                old.close()
        self._link = link
        return link

    def close(self) -> None:
        """Close the connection; calls under way fail with ConnectionError."""
        self._closed = True
        if self._link is not None:
            self._link.close()
            self._link = None
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
