"""What every timeslice gRPC server shares at its edge.

- Requests are read with a size limit checked from the 5-byte message header,
  before the body is read, and parsed strictly (`decode_strict`).
- Domain errors become gRPC statuses here and nowhere else; anything
  unexpected is logged and answered INTERNAL.
- Each call passes its server's `CallGate`, so that closing can refuse new calls
  and drain those in flight; the gate's `Authenticator` says who the caller is
  (`timeslice.security.callers.CURRENT`, for the servicer's `authorize`).
- A unary call waits at most `CallGate.message_timeout` for its request message.
- The server closes the connections it accepted when it closes, and listens on
  a socket with Nagle off; it holds its connections to `ConnectionLimits`
  (see `timeslice.api.connections`).
- A reply that many streams send alike (a Watch event) is encoded once and sent
  to each as bytes (`Encoded`); so is a reply encoded by hand (`timeslice.api.hot`).
"""

from __future__ import annotations

import asyncio
import gc
import keyword
import logging
import re
import socket
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from ssl import SSLContext
from typing import Any, Protocol, TypeVar

import betterproto2
import grpclib.const
import grpclib.server
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol

from timeslice.api.connections import (
    Census,
    ConnectionLimits,
    LimitedProtocol,
    warn_if_files_run_short,
)
from timeslice.api.wire import decode_strict
from timeslice.api.status import to_grpc_error
from timeslice.errors import TimeSliceError, UnavailableError
from timeslice.security.callers import CURRENT, Authenticator
from timeslice.security.exposure import left_open
from timeslice.security.principals import AuthPolicy
from timeslice.security.tls import ServerTls

_T = TypeVar("_T")

log = logging.getLogger(__name__)

# A small stream window: a message over the size limit is refused after its
# 5-byte header, with at most one window of it ever buffered.
STREAM_WINDOW_BYTES = 256 * 1024


class CallGate:
    """Admits a server's calls while it serves, counts those in flight, and lets the
    server wait for them when it closes."""

    def __init__(
        self,
        what: str,
        max_message_bytes: int,
        message_timeout: float = 10.0,
        authenticator: Authenticator | None = None,
    ) -> None:
        self.what = what
        # Who each call's caller is (see `timeslice.security.callers`).
        self.authenticator = authenticator or Authenticator(None, what)
        self.max_message_bytes = max_message_bytes
        # A unary call's request message must arrive this soon after its headers: a
        # stream opened and left half-sent would otherwise hold its task forever.
        self.message_timeout = message_timeout
        self.open = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Count one call in flight; refuse it (UNAVAILABLE) unless open."""
        if not self.open:
            raise UnavailableError(f"{self.what} is not serving")
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def close(self, timeout: float) -> None:
        """Refuse new calls; wait up to `timeout` seconds for those in flight."""
        self.open = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("%s closes with %d call(s) in flight", self.what, self._in_flight)


class EdgeCall(Protocol):
    """What the edge needs of a call, whichever server carries it: its credentials,
    its request messages (read bounded and parsed strictly), its replies, and its
    end with a status of the edge's own choosing."""

    @property
    def metadata(self) -> Mapping[str, Any] | None: ...

    @property
    def peer(self) -> Any: ...

    @property
    def arrived(self) -> bool:
        """Whether every request message is here already (False: not known)."""
        ...

    async def recv(self, limit: int) -> Any:
        """The next request message (None at the end of the stream)."""
        ...

    async def send(self, reply: Any) -> None:
        """Send a reply message (a betterproto2 message or `Encoded`)."""
        ...

    async def end(self, status: Status, message: str, metadata: Mapping[str, str]) -> None:
        """End the call with `status` and trailing `metadata`, sending nothing else."""
        ...


class EdgeHandler:
    """A route's handling at the edge (`fn`, over an `EdgeCall`): grpclib's server
    calls it with its stream; another server calls `fn` with a call of its own."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[EdgeCall], Awaitable[None]]) -> None:
        self.fn = fn

    async def __call__(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        await self.fn(GrpclibCall(stream))

    def behind(
        self,
        outer: Callable[
            [Callable[[EdgeCall], Awaitable[None]]], Callable[[EdgeCall], Awaitable[None]]
        ],
    ) -> EdgeHandler:
        """This handling wrapped in `outer` (a check that may answer instead)."""
        return EdgeHandler(outer(self.fn))


class GrpclibCall:
    """An `EdgeCall` on grpclib's server stream."""

    __slots__ = ("stream",)

    def __init__(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        self.stream = stream

    @property
    def metadata(self) -> Mapping[str, Any] | None:
        return self.stream.metadata

    @property
    def peer(self) -> Any:
        return self.stream.peer

    @property
    def arrived(self) -> bool:
        return False

    async def recv(self, limit: int) -> Any:
        return await recv_bounded(self.stream, limit)

    async def send(self, reply: Any) -> None:
        if isinstance(reply, Encoded):
            await send_encoded(self.stream, reply)
        else:
            await self.stream.send_message(reply)

    async def end(self, status: Status, message: str, metadata: Mapping[str, str]) -> None:
        await self.stream.send_trailing_metadata(
            status=status, status_message=message, metadata=dict(metadata)
        )


def edge_mapping(
    generated: dict[str, grpclib.const.Handler], service: Any, gate: CallGate
) -> dict[str, grpclib.const.Handler]:
    """The generated routes (`super().__mapping__()` of a servicer), each handled by
    the servicer's method of the same name, with bounded strict reads and error
    translation (an `EdgeHandler` each)."""
    return {
        route: grpclib.const.Handler(
            EdgeHandler(_handler(service, gate, _method_name(route), handler.cardinality)),
            handler.cardinality,
            handler.request_type,
            handler.reply_type,
        )
        for route, handler in generated.items()
    }


def _method_name(route: str) -> str:
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", route.rsplit("/", 1)[1]).lower()
    return f"{name}_" if keyword.iskeyword(name) else name


def _handler(
    service: Any, gate: CallGate, name: str, cardinality: Cardinality
) -> Callable[[EdgeCall], Awaitable[None]]:
    method = getattr(service, name)

    async def handle(call: EdgeCall) -> None:
        try:
            # The call's own task: the caller set here is seen by the servicer only.
            CURRENT.set(gate.authenticator.identify(call))
            async with gate.call():
                limit = gate.max_message_bytes
                if cardinality in (Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM):
                    request = await _request_in_time(call, limit, gate.message_timeout)
                    if request is None:
                        raise GRPCError(Status.INVALID_ARGUMENT, "the request carries no message")
                else:
                    request = _requests(call, limit)
                if cardinality in (Cardinality.UNARY_UNARY, Cardinality.STREAM_UNARY):
                    await call.send(await method(request))
                else:
                    async for reply in method(request):
                        await call.send(reply)
        except TimeSliceError as exc:
            raise to_grpc_error(exc) from exc
        except (GRPCError, TimeoutError):
            raise
        except Exception as exc:
            log.exception("%s failed", name)
            raise GRPCError(Status.INTERNAL, f"internal error: {type(exc).__name__}") from exc

    return handle


async def _request_in_time(call: EdgeCall, limit: int, timeout: float) -> Any:
    if call.arrived:  # as a unary request mostly is: no timer to set and cancel
        return await call.recv(limit)
    try:
        # asyncio.timeout, not wait_for: no task of its own for every call. A
        # deadline of the client's own or a closed connection cancels the call
        # as a cancellation, never as this TimeoutError.
        async with asyncio.timeout(timeout):
            return await call.recv(limit)
    except TimeoutError:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED, f"the request message did not arrive within {timeout:g} s"
        ) from None


class Encoded:
    """Reply messages encoded and framed for the wire, sent as they are.

    A message that many streams send alike costs one encoding, not one per
    stream: the first stream to send it encodes it (`frames`), the others send
    the same bytes. `join` puts several in one write.
    """

    __slots__ = ("_message", "_frames")

    def __init__(self, message: betterproto2.Message) -> None:
        self._message: betterproto2.Message | None = message
        self._frames: bytes | None = None

    @classmethod
    def of_body(cls, body: bytes) -> Encoded:
        """A message encoded already (see `timeslice.api.hot`)."""
        return cls.of_frames(b"\0" + len(body).to_bytes(4, "big") + body)

    @classmethod
    def of_frames(cls, frames: bytes) -> Encoded:
        encoded = cls.__new__(cls)
        encoded._message, encoded._frames = None, frames
        return encoded

    @property
    def frames(self) -> bytes:
        """The message with its 5-byte gRPC header (not compressed, its length)."""
        if self._frames is None:
            assert self._message is not None
            body = bytes(self._message)
            self._frames = b"\0" + len(body).to_bytes(4, "big") + body
            self._message = None
        return self._frames

    @classmethod
    def join(cls, items: list[Encoded]) -> Encoded:
        """One reply carrying `items`, in order."""
        if len(items) == 1:
            return items[0]
        return cls.of_frames(b"".join(item.frames for item in items))


async def send_encoded(stream: grpclib.server.Stream[Any, Any], reply: Encoded) -> None:
    """Send `reply`'s messages on `stream` without encoding them again."""
    if not stream._send_initial_metadata_done:
        await stream.send_initial_metadata()
    # grpclib's send_message would encode; its framing is the same as `frames`.
    await stream._stream.send_data(reply.frames)
    stream._send_message_done = True


async def _requests(call: EdgeCall, limit: int) -> AsyncIterator[Any]:
    while (request := await call.recv(limit)) is not None:
        yield request


async def recv_bounded(stream: grpclib.server.Stream[Any, Any], limit: int) -> Any:
    """Read one message of at most `limit` bytes (None at the end of the stream),
    refusing a larger one after its 5-byte header; parse it strictly."""
    raw = stream._stream  # grpclib reads whole messages with no size limit
    try:
        header = await raw.recv_data(5)
    except AssertionError:  # grpclib's word for a stream that ended inside a read
        raise GRPCError(Status.INVALID_ARGUMENT, "the message is truncated") from None
    if not header:
        return None
    if len(header) < 5:
        raise GRPCError(Status.INVALID_ARGUMENT, "the message is truncated")
    if header[0]:
        raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not supported")
    size = int.from_bytes(header[1:5], "big")
    if size > limit:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED, f"message of {size} bytes is over the {limit}-byte limit"
        )
    try:
        body = await raw.recv_data(size)
    except AssertionError:
        raise GRPCError(Status.INVALID_ARGUMENT, "the message is truncated") from None
    if len(body) != size:
        raise GRPCError(Status.INVALID_ARGUMENT, "the message is truncated")
    try:
        return decode_strict(stream._recv_type, body)
    except ValueError as exc:
        raise GRPCError(Status.INVALID_ARGUMENT, f"malformed request: {exc}") from exc


class Listening(Protocol):
    """Where and how a server listens (`OrchestratorConfig` and `AgentConfig` are)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def tls(self) -> ServerTls | None: ...

    @property
    def auth(self) -> AuthPolicy | None: ...


class GrpcServer(grpclib.server.Server):
    """grpclib's server, which also closes the connections it accepted when asked:
    its own close() only stops listening and cancels calls, so clients would keep
    talking to a server that is gone instead of reconnecting to its successor.
    It holds its connections to `limits`; `what` names it in what it answers."""

    def __init__(
        self,
        handlers: list[Any],
        limits: ConnectionLimits | None = None,
        what: str = "the server",
    ) -> None:
        super().__init__(
            handlers, config=Configuration(http2_stream_window_size=STREAM_WINDOW_BYTES)
        )
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()
        self.connections = Census(limits or ConnectionLimits(), what)

    def _protocol_factory(self) -> H2Protocol:
        # grpclib's own factory, with a protocol that counts itself in once
        # connected and out when the connection is lost.
        self.__gc_step__()
        handler = grpclib.server.Handler(
            self._mapping, self._codec, self._status_details_codec, self.__dispatch__
        )
        self._handlers.add(handler)
        protocol = LimitedProtocol(handler, self._config, self._h2_config, self.connections)
        self._protocols.add(protocol)
        return protocol

    async def serve(self, host: str, port: int, ssl: SSLContext | None = None) -> str:
        """Listen on HOST:PORT (0: any free port), over TLS with `ssl`; return the
        address as "HOST:PORT"."""
        sock = listening_socket(host, port)
        if ssl is None:
            await self.start(sock=sock)
        else:
            await self._start_tls(sock, ssl)
        warn_if_files_run_short(self.connections.limits, self.connections.what)
        return bound_address(sock)

    async def serve_configured(self, config: Listening) -> str:
        """`serve` on the config's host and port, over TLS when it has some; a server
        open to the network without TLS or auth says so (it may, with `insecure`)."""
        tls = config.tls
        address = await self.serve(
            config.host, config.port, ssl=None if tls is None else tls.context()
        )
        warn_if_left_open(self.connections.what, address, config)
        return address

    async def _start_tls(self, sock: socket.socket, ssl: SSLContext) -> None:
        """grpclib's `start`, with a TLS handshake bounded by the header timeout: its own
        leaves asyncio's minute, and a handshake under way is not yet a connection that
        the limits count, so a peer that never finishes one would hold its socket."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        self._server = await asyncio.get_running_loop().create_server(
            self._protocol_factory,
            sock=sock,
            ssl=ssl,
            ssl_handshake_timeout=self.connections.limits.header_timeout,
        )
        self._server_closed_fut = asyncio.get_running_loop().create_future()

    async def stop(self) -> None:
        """Stop listening, cancel what still runs, and close every connection."""
        if self._server is None:
            # It never listened (its start failed): grpclib's close() would raise
            # "Server is not started" and hide why.
            return
        self.close()
        await self.wait_closed()
        for protocol in list(self._protocols):
            if hasattr(protocol, "processor"):
                protocol.processor.close("the server is closing")


def bound_address(sock: socket.socket) -> str:
    """The address `sock` listens on, as "HOST:PORT" ("[HOST]:PORT" for IPv6)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def warn_if_left_open(what: str, address: str, config: Listening) -> None:
    """Log what a server open to the network without TLS or auth leaves open (it
    may listen so, with `insecure`)."""
    tls, auth = config.tls is not None, config.auth is not None
    if warning := left_open(what, address, host=config.host, tls=tls, auth=auth):
        log.warning("%s", warning)


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket with Nagle off (else each call waits ~40 ms for an ACK)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def until_set(items: AsyncIterator[_T], stop: asyncio.Event) -> AsyncIterator[_T]:
    """`items`, until they end or `stop` is set (a long-lived request stream that
    must not hold a server's shutdown)."""
    stopped = asyncio.ensure_future(stop.wait())
    item: asyncio.Future[_T | None] | None = None
    try:
        while True:
            item = asyncio.ensure_future(anext(items, None))
            await asyncio.wait({item, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not item.done() or (value := item.result()) is None:
                return
            yield value
    finally:
        stopped.cancel()
        if item is not None and not item.done():
            item.cancel()
            await asyncio.gather(item, return_exceptions=True)


def tune_gc_for_serving() -> None:
    """Set this process's garbage collector for serving an orchestrator: collect the
    youngest objects every 50,000 allocations instead of every 700.

    Every waiting Acquire keeps some eighty objects alive (its stream, its futures,
    its place in the table) for as long as it waits, and every collection of the
    oldest generation walks them all: with thousands of jobs queued, the default
    thresholds spend a third of the orchestrator's time there. What an Acquire or
    a Yield allocates is freed by reference counting, not by the collector, so
    collecting rarely loses nothing. `timeslice serve orchestrator` calls this; a
    program that embeds an Orchestrator decides for itself.
    """
    gc.set_threshold(50_000, 20, 10)
