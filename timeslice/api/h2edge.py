"""The edge's routes (`timeslice.api.serving.edge_mapping`) served by our own gRPC
server (`timeslice.api.h2serve`) instead of grpclib's.

The servicers are the same objects grpclib's server takes: their `__mapping__`
routes, each an `EdgeHandler`, run here over an `H2Call`, so that what a call may
do and how it fails (bounded strict reads, authentication, error translation) is
the edge's, whichever server carries it. `edge_server` makes the server a
config's `http2` names, this one or grpclib's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from timeslice.api.connections import ConnectionLimits, check_http2
from timeslice.api.h2serve import Call, CallError, H2Server, Route
from timeslice.api.serving import (
    EdgeHandler,
    Encoded,
    GrpcServer,
    Listening,
    bound_address,
    listening_socket,
    warn_if_left_open,
)
from timeslice.api.wire import decode_strict
from timeslice.errors import Code


class _Peer:
    """The connection's far end, as `Authenticator.identify` reads it."""

    __slots__ = ("_transport",)

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def cert(self) -> Any:
        return self._transport.get_extra_info("peercert") if self._transport else None


class H2Call:
    """An `EdgeCall` on an h2serve `Call`."""

    __slots__ = ("call", "request_type", "_metadata")

    def __init__(self, call: Call, request_type: Any) -> None:
        self.call = call
        self.request_type = request_type
        self._metadata: dict[str, str] | None = None

    @property
    def metadata(self) -> Mapping[str, Any]:
        if self._metadata is None:
            metadata: dict[str, str] = {}
            for name, value in self.call.metadata:
                metadata.setdefault(name, value)  # the first of a repeated name counts
            self._metadata = metadata
        return self._metadata

    @property
    def peer(self) -> Any:
        return _Peer(self.call.transport)

    @property
    def arrived(self) -> bool:
        return self.call.ended

    async def recv(self, limit: int) -> Any:
        try:
            body = await self.call.recv(limit)
        except CallError as exc:
            raise GRPCError(Status(int(exc.code)), exc.message) from None
        if body is None:
            return None
        try:
            return decode_strict(self.request_type, body)
        except ValueError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, f"malformed request: {exc}") from exc

    async def send(self, reply: Any) -> None:
        self.call.send((reply if isinstance(reply, Encoded) else Encoded(reply)).frames)
        await self.call.drain()

    async def end(self, status: Status, message: str, metadata: Mapping[str, str]) -> None:
        self.call.finish(Code(status.value), message, list(metadata.items()))


def h2_routes(servicers: Iterable[Any]) -> dict[str, Route]:
    """Every route of `servicers` (their `__mapping__`, made by `edge_mapping`)."""
    routes: dict[str, Route] = {}
    for servicer in servicers:
        for path, handler in servicer.__mapping__().items():
            if not isinstance(handler.func, EdgeHandler):
                raise TypeError(f"{path} is not an edge route (see serving.edge_mapping)")
            routes[path] = Route(_serving(handler.func, handler.request_type))
    return routes


def _serving(edge: EdgeHandler, request_type: Any) -> Any:
    fn = edge.fn

    async def serve(call: Call) -> None:
        try:
            await fn(H2Call(call, request_type))
        except GRPCError as exc:
            raise CallError(Code(exc.status.value), exc.message or "") from exc

    return serve


class EdgeServer(H2Server):
    """The edge's servicers on h2serve, listening where a server's config says."""

    def __init__(
        self, servicers: Iterable[Any], limits: ConnectionLimits | None = None, what: str = ""
    ) -> None:
        super().__init__(h2_routes(servicers), limits, what or "the server")

    async def serve_configured(self, config: Listening) -> str:
        """Listen on the config's host and port, over TLS when it has some; the
        address as "HOST:PORT". A server open to the network without TLS or auth
        says so (it may, with `insecure`)."""
        sock = listening_socket(config.host, config.port)
        try:
            await self.start(sock, None if config.tls is None else config.tls.context())
        except BaseException:
            sock.close()
            raise
        address = bound_address(sock)
        warn_if_left_open(self.connections.what, address, config)
        return address


def edge_server(
    http2: str, servicers: list[Any], limits: ConnectionLimits, what: str
) -> EdgeServer | GrpcServer:
    """A server of `servicers` on the HTTP/2 server `http2` names (see
    `timeslice.api.connections.HTTP2_SERVERS`)."""
    check_http2(http2)
    if http2 == "grpclib":
        return GrpcServer(servicers, limits, what)
    return EdgeServer(servicers, limits, what)
