"""The channel a client calls its orchestrator through, moved along its candidates.

A target may list several addresses, and a name may resolve to several
(`timeslice.targets`). The connector dials one candidate at a time; when a call
finds it unreachable or refused (UNAVAILABLE: a standby, a server closing, a
connection that broke or stopped answering) the next call goes to the next
candidate, or to the active a standby named, if it is one of the candidates.
Names are resolved with the event loop's `getaddrinfo` when the connector
starts a round through the list, so that a changed DNS answer is seen.

A server that stops answering altogether (frozen, partitioned: the TCP
connection stays open) is noticed through HTTP/2 pings: while a call is open the
connection is pinged every `Pings.every` seconds, and closed when a ping goes
unanswered for `Pings.timeout` seconds; the calls on it then fail UNAVAILABLE
and are retried on the next candidate.

Beside each candidate's grpclib channel (its streams, and the calls of a client
that asks for grpclib) the connector keeps an `H2Channel` to the same candidate
for the hot unary calls (`unary`), with the same credentials and pings, closed
and replaced with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from grpclib.client import Channel, Stream
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.events import RecvTrailingMetadata, listen
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.protocol import H2Protocol

from timeslice.api.h2client import H2Channel, StatusError
from timeslice.client._transport import close_channel, open_channel, open_unary
from timeslice.errors import InvalidArgumentError, UnavailableError
from timeslice.ids import Target
from timeslice.security.tls import ClientTls
from timeslice.targets import (
    ACTIVE_KEY,
    LEASE_KEY,
    MAX_ENDPOINTS,
    Endpoint,
    active_from_metadata,
    is_ip_literal,
    lease_from_metadata,
    next_candidate,
    shun_seconds,
)

T = TypeVar("T")

DEFAULT_PING_EVERY_SEC = 0.5
DEFAULT_PING_TIMEOUT_SEC = 1.5
#: How long at most a candidate this client gave up on is not gone back to on a
#: standby's word: a standby names the active until the active's lease runs out (5 s
#: by default), frozen or not. It is still tried in its turn down the list. A standby's
#: refusal says its lease (`LEASE_KEY`): once one has, the candidate is passed over
#: only as long as a standby may still name it (`shun_seconds`), so that one that
#: comes back and is elected again (restarted, say) is followed as soon as it is.
SHUN_SEC = 5.0


@dataclass(frozen=True, kw_only=True)
class Pings:
    """HTTP/2 keepalive pings while a call is open: one every `every` seconds; the
    connection is closed when one is unanswered for `timeout` seconds. A server that
    stops answering is so given up on within `every + timeout` seconds."""

    every: float = DEFAULT_PING_EVERY_SEC
    timeout: float = DEFAULT_PING_TIMEOUT_SEC

    def __post_init__(self) -> None:
        for name in ("every", "timeout"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value <= 3600):
                raise InvalidArgumentError(f"ping {name} must be between 0 and 3600 s: {value}")

    def configuration(self, **options: Any) -> Configuration:
        """grpclib's client configuration for these pings."""
        return Configuration(
            _keepalive_time=self.every,
            _keepalive_timeout=self.timeout,
            _keepalive_permit_without_calls=False,  # an idle connection costs nothing
            _http2_max_pings_without_data=0,  # a quiet stream (a waiting Acquire) too
            _http2_min_sent_ping_interval_without_data=self.every / 2,
            **options,
        )


def unreachable(error: BaseException) -> bool:
    """Whether a call's `error` says its server cannot serve it now (so that the next
    candidate should be tried): UNAVAILABLE, a broken stream or a socket error, not a
    deadline that ran out."""
    if isinstance(error, UnavailableError | StreamTerminatedError):
        return True
    if isinstance(error, GRPCError):
        return error.status is Status.UNAVAILABLE
    return isinstance(error, OSError) and not isinstance(error, TimeoutError)


def answered(error: BaseException | None) -> bool:
    """Whether `error` is a server's own answer (a status it sent: a standby's
    refusal), rather than a connection that could not be made, broke or went silent.
    None (a stream the server ended itself) counts as an answer."""
    if error is None or isinstance(error, GRPCError):
        return True
    return isinstance(error.__cause__, GRPCError)


def with_trailers(error: GRPCError, stream: Stream[Any, Any] | None) -> GRPCError:
    """`error`, raised by grpclib's `stream`, with the trailers-only answer it came in
    when there was one, as `failed` reads a refusal's trailers (the active, the lease).
    grpclib raises such an answer without dispatching its metadata when it comes while
    a message is being sent on a stream (the server resets the stream after it)."""
    headers = getattr(getattr(stream, "_stream", None), "headers", None)
    if not headers or not any(key == "grpc-status" for key, _ in headers):
        return error
    trailers = [(str(k), str(v)) for k, v in headers if not str(k).startswith(":")]
    return StatusError(error.status, error.message, trailers)


def _abort_when_closed(channel: Channel) -> None:
    """Make `channel`'s connections drop their socket at once when grpclib closes them
    (an unanswered ping, a lost connection). A TLS transport's own close first waits for
    the peer's close_notify, up to asyncio's 30 s shutdown timeout: a frozen server
    never sends it, and the calls on the connection would wait as long."""
    make = channel._protocol_factory

    def factory() -> H2Protocol:
        protocol = make()
        made = protocol.connection_made

        def connection_made(transport: Any) -> None:
            made(transport)
            connection = protocol.connection
            close = connection.close

            def abort_then_close() -> None:
                transport.abort()
                close()

            setattr(connection, "close", abort_then_close)  # noqa: B010 (an instance's method)

        setattr(protocol, "connection_made", connection_made)  # noqa: B010
        return protocol

    setattr(channel, "_protocol_factory", factory)  # noqa: B010


class Connector:
    """One client's channel to its orchestrator, among `targets` (see the module)."""

    def __init__(
        self,
        targets: tuple[Target, ...],
        tls: ClientTls | None,
        token: str | None,
        pings: Pings | None = Pings(),
        http2: str = "h2core",
    ) -> None:
        if not targets:
            raise InvalidArgumentError("no orchestrator address")
        self._targets, self._tls, self._token, self._pings = targets, tls, token, pings
        self._http2 = http2
        self._endpoints: list[Endpoint] = []
        self._index: int | None = None  # the candidate of `_channel`, or the next one
        self._channel: Channel | None = None
        self._unary: H2Channel | None = None  # to the same candidate as `_channel`
        # The active that a refusal received on a channel named (keyed by id: a
        # Channel is not hashable by value, and an entry goes with its channel).
        self._redirects: dict[int, Target] = {}
        # The candidates given up on (unreachable, not answering), and when (loop time):
        # a refusal naming one of them is not followed for a while (`_shunned`).
        self._gave_up: dict[Target, float] = {}
        # The leader lease the last refusal that said one named (seconds).
        self._lease: float | None = None
        self._resolving = asyncio.Lock()
        self._closed = False

    @property
    def current(self) -> Endpoint | None:
        """The candidate the next call goes to, once one is chosen."""
        if self._index is None or not self._endpoints:
            return None
        return self._endpoints[self._index]

    async def channel(self) -> Channel:
        """The channel to the current candidate (dialled on its first call)."""
        if self._closed:
            raise RuntimeError("the orchestrator client is closed")
        if self._channel is None:
            async with self._resolving:
                if self._channel is None:
                    if not self._endpoints or self._index is None:
                        await self._resolve()
                        if self._index is None:  # a new round: not where it just gave up
                            self._index = next_candidate(
                                self._endpoints, None, None, self._shunned()
                            )
                    self._channel = self._open(self._endpoints[self._index])
        return self._channel

    def unary(self, channel: Channel) -> H2Channel | None:
        """The `H2Channel` of `channel`'s candidate, for the unary calls that take it
        (None: the client asked for grpclib's, or `channel` is not the current one)."""
        if self._http2 != "h2core" or channel is not self._channel or self._index is None:
            return None
        if self._unary is None:
            endpoint = self._endpoints[self._index]
            tls, override = self._tls_of(endpoint)
            pings = None if self._pings is None else (self._pings.every, self._pings.timeout)
            self._unary = open_unary(
                endpoint.dial, tls, self._token, pings=pings, server_hostname=override
            )
        return self._unary

    def failed(
        self,
        channel: Channel,
        *,
        close: bool = False,
        refused: bool = False,
        error: BaseException | None = None,
    ) -> None:
        """A call on `channel` found its server unreachable (`refused`: it answered,
        refusing; `error`: what it raised, whose trailers may name the active): the
        next call goes to the next candidate (or to the active a refusal named), on a
        new connection. A candidate that did not answer is passed over for `SHUN_SEC`
        while others are left. With a single candidate the channel is kept (grpclib
        dials it again by itself) unless `close`."""
        redirect = self._redirects.pop(id(channel), None)
        if redirect is None and isinstance(error, StatusError):
            if error.status is Status.UNAVAILABLE:
                redirect = active_from_metadata(v for k, v in error.trailers if k == ACTIVE_KEY)
                self._heard_lease(v for k, v in error.trailers if k == LEASE_KEY)
        if channel is not self._channel:
            return  # another call moved on already
        assert self._index is not None
        if not refused:  # it could not be reached, or stopped answering
            self._gave_up[self._endpoints[self._index].dial] = asyncio.get_running_loop().time()
        following = next_candidate(self._endpoints, self._index, redirect, self._shunned())
        if following == self._index and not close:
            return
        self._channel = None
        close_channel(channel)
        self._close_unary()
        if following <= self._index and redirect is None:
            # A round through the list is over: resolve the names again before the next.
            self._endpoints = []
            self._index = None
        else:
            self._index = following

    def _shunned(self) -> set[Target]:
        """The candidates given up on less than `SHUN_SEC` ago, or less than a
        standby may name them, when a refusal said its lease."""
        now = asyncio.get_running_loop().time()
        shun = shun_seconds(self._lease, SHUN_SEC)
        self._gave_up = {t: at for t, at in self._gave_up.items() if now - at < shun}
        return set(self._gave_up)

    def _heard_lease(self, values: Iterable[object]) -> None:
        """A refusal's `LEASE_KEY` values: the lease its standby follows, if they say."""
        lease = lease_from_metadata(values)
        if lease is not None:
            self._lease = lease

    @contextlib.contextmanager
    def using(self, channel: Channel) -> Iterator[None]:
        """Around a call or a stream on `channel`: an error that says its server cannot
        serve moves the connector on (`failed`), and is raised as it was."""
        try:
            yield
        except BaseException as error:
            if unreachable(error):
                self.failed(channel, refused=answered(error), error=error)
            raise

    async def call(self, send: Callable[[Channel], Awaitable[T]]) -> T:
        """`send(channel)` on the current candidate's channel (see `using`)."""
        channel = await self.channel()
        with self.using(channel):
            return await send(channel)

    def close(self) -> None:
        """Close the connection; the connector dials nothing more."""
        self._closed = True
        if self._channel is not None:
            channel, self._channel = self._channel, None
            close_channel(channel)
        self._close_unary()
        self._redirects.clear()

    def _close_unary(self) -> None:
        if self._unary is not None:
            unary, self._unary = self._unary, None
            unary.close()

    async def _resolve(self) -> None:
        """The candidates: each target, a name as every address it resolves to."""
        loop = asyncio.get_running_loop()
        endpoints: list[Endpoint] = []
        for target in self._targets:
            host = target.host
            if target.path is not None or host is None or is_ip_literal(host):
                found = [target]
            else:
                try:
                    infos = await loop.getaddrinfo(
                        host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
                    )
                except OSError:
                    infos = []  # dialling the name itself reports why
                addresses = dict.fromkeys(str(info[4][0]) for info in infos)
                found = [Target(host=a, port=target.port) for a in addresses] or [target]
            for dial in found:
                endpoint = Endpoint(dial=dial, given=target)
                if endpoint not in endpoints and len(endpoints) < MAX_ENDPOINTS:
                    endpoints.append(endpoint)
        self._endpoints = endpoints
        if self._index is not None and self._index >= len(endpoints):
            self._index = 0

    def _tls_of(self, endpoint: Endpoint) -> tuple[ClientTls | None, str | None]:
        """The TLS of a connection to `endpoint` (None on a Unix socket), and the name
        its certificate is checked against when it is not the address dialled: a
        resolved address is dialled, but TLS checks the name that was given."""
        tls = self._tls if endpoint.dial.path is None else None
        name = endpoint.given.host
        return tls, (name if tls is not None and name != endpoint.dial.host else None)

    def _open(self, endpoint: Endpoint) -> Channel:
        tls, override = self._tls_of(endpoint)
        config = None
        if self._pings is not None:
            config = self._pings.configuration(ssl_target_name_override=override)
        elif override is not None:
            config = Configuration(ssl_target_name_override=override)
        channel = open_channel(endpoint.dial, tls, self._token, config=config)
        _abort_when_closed(channel)

        async def remember_active(event: RecvTrailingMetadata) -> None:
            if event.status is Status.UNAVAILABLE and self._channel is channel:
                active = active_from_metadata(event.metadata.getall(ACTIVE_KEY, []))
                if active is not None:
                    self._redirects[id(channel)] = active
                self._heard_lease(event.metadata.getall(LEASE_KEY, []))

        listen(channel, RecvTrailingMetadata, remember_active)
        return channel
