"""The edge's routes (`timeslice.api.serving.edge_mapping`) served by our own gRPC
server (`timeslice.api.h2serve`) instead of grpclib's.

The servicers are the same objects grpclib's server takes: their `__mapping__`
routes, each an `EdgeHandler`, run here over an `H2Call`, so that what a call may
do and how it fails (bounded strict reads, authentication, error translation) is
the edge's, whichever server carries it. Not served here yet: TLS and the
connection limits of `timeslice.api.connections` (how many connections, how long
one may stay idle); a server configured with TLS refuses to start on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from timeslice.api.h2core import Limits
from timeslice.api.h2serve import Call, CallError, H2Server, Route
from timeslice.api.serving import (
    EdgeHandler,
    Encoded,
    Listening,
    bound_address,
    listening_socket,
    warn_if_left_open,
)
from timeslice.api.wire import decode_strict
from timeslice.errors import Code, InvalidArgumentError


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

    def __init__(self, servicers: Iterable[Any], what: str, limits: Limits | None = None):
        super().__init__(h2_routes(servicers), limits)
        self.what = what

    async def serve_configured(self, config: Listening) -> str:
        """Listen on the config's host and port; the address as "HOST:PORT"."""
        if config.tls is not None:
            raise InvalidArgumentError(f"{self.what} cannot serve TLS on h2core yet")
        sock = listening_socket(config.host, config.port)
        await self.start(sock)
        address = bound_address(sock)
        warn_if_left_open(self.what, address, config)
        return address
