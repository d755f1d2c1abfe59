"""The connections a timeslice server accepts, held to its limits.

An HTTP/2 server serves every connection for as long as its peer keeps it, and
each one costs a state machine, buffers and a task per stream: a peer that opens
thousands, or opens them and sends nothing, would hold the server's memory. Both
servers a timeslice server can run on (`HTTP2_SERVERS`: our own `h2serve`, the
default, or grpclib's) are held to the same limits, counted in one `Census`:

- at most `max_connections` at once: one over is answered, call by call,
  RESOURCE_EXHAUSTED (a short trailers-only answer, no handler runs) and then
  closed;
- at most `max_streams` streams on each, advertised in SETTINGS_MAX_CONCURRENT_STREAMS
  (a client queues its calls beyond it; one that ignores it has its connection
  closed by the HTTP/2 layer);
- a connection that has sent no complete request headers `header_timeout`
  seconds after it opened is closed, and so is one that has had no stream open
  for `idle_timeout` seconds. A stream that stays open (a Watch, an agent's
  session, an Acquire that waits) keeps its connection, however quiet.

How long a unary call may wait for its request message is the edge's to bound
(`CallGate.message_timeout`): a stream opened is a stream counted here. What a
peer leaves unread is bounded by the server it runs on (`max_unsent` on h2serve).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.metadata import encode_grpc_message
from grpclib.protocol import AbstractHandler, Connection, EventsProcessor, H2Protocol, Stream
from h2.config import H2Configuration
from h2.errors import ErrorCodes
from h2.events import RequestReceived
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes

from timeslice.api.coalesce import Coalesced
from timeslice.errors import InvalidArgumentError

log = logging.getLogger(__name__)

# How long a refused connection stays open after its first answer, so that the
# peer reads the answer before it sees the connection close.
REFUSED_LINGER = 1.0
# Refused connections are logged at most this often (seconds), with their count.
REFUSAL_WARNING_EVERY = 10.0
# Files a server process keeps open besides its connections: its journal or job
# table, its clients of other servers, its logs.
SPARE_FILES = 64
# The HTTP/2 servers a timeslice server may run on (its config's `http2`): ours
# (`timeslice.api.h2edge`), or grpclib's (`GrpcServer` here).
HTTP2_SERVERS = ("h2core", "grpclib")


def check_http2(http2: str) -> None:
    """Refuse an HTTP/2 server that is not one of `HTTP2_SERVERS`."""
    if http2 not in HTTP2_SERVERS:
        raise InvalidArgumentError(
            f"http2 must be one of {', '.join(HTTP2_SERVERS)}, not {http2!r}"
        )


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """What one server allows its peers. Validated on construction."""

    max_connections: int = 1024
    max_streams: int = 128  # per connection
    header_timeout: float = 10.0  # seconds from accept to the first request's headers
    idle_timeout: float = 300.0  # seconds with no stream open
    message_timeout: float = 10.0  # seconds a unary call waits for its request message

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_streams < 1:
            raise InvalidArgumentError("max_connections and max_streams must be at least 1")
        for name in ("header_timeout", "idle_timeout", "message_timeout"):
            if not getattr(self, name) > 0:
                raise InvalidArgumentError(f"{name} must be positive")


class LimitedConfig(Protocol):
    """A server's configuration with the connection limits' fields (its own names)."""

    @property
    def max_connections(self) -> int: ...
    @property
    def max_streams_per_connection(self) -> int: ...
    @property
    def header_timeout(self) -> float: ...
    @property
    def idle_timeout(self) -> float: ...
    @property
    def message_timeout(self) -> float: ...


def connection_limits(config: LimitedConfig) -> ConnectionLimits:
    """The connection limits a server's configuration sets (checked here)."""
    return ConnectionLimits(
        max_connections=config.max_connections,
        max_streams=config.max_streams_per_connection,
        header_timeout=config.header_timeout,
        idle_timeout=config.idle_timeout,
        message_timeout=config.message_timeout,
    )


def warn_if_files_run_short(limits: ConnectionLimits, what: str) -> None:
    """Warn when the process would run out of file descriptors before it reaches
    `max_connections`: asyncio then stops accepting for a second at a time, and
    every peer waits instead of being answered."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and limits.max_connections + SPARE_FILES > soft:
        log.warning(
            "%s allows %d connections but may open only %d files (ulimit -n): raise the"
            " limit of open files or lower max_connections",
            what,
            limits.max_connections,
            soft,
        )


class Census:
    """The connections a server holds against its limit (whichever server: each
    connection is counted in by `admit` and out with `open.discard`)."""

    def __init__(self, limits: ConnectionLimits, what: str) -> None:
        self.limits, self.what = limits, what
        self.open: set[object] = set()
        self.refused = 0  # since the last warning
        self._warned_at = -REFUSAL_WARNING_EVERY

    @property
    def refusal(self) -> str:
        """What a connection over the limit is answered (RESOURCE_EXHAUSTED)."""
        return f"{self.what} has {self.limits.max_connections} connections, its limit"

    def admit(self, protocol: object) -> bool:
        """Count `protocol` in, or (at the limit) say that it is refused."""
        if len(self.open) < self.limits.max_connections:
            self.open.add(protocol)
            return True
        self.refused += 1
        now = asyncio.get_running_loop().time()
        if now - self._warned_at >= REFUSAL_WARNING_EVERY:  # a flood must not flood the log
            log.warning(
                "%s refused %d connection(s): %d open, its limit",
                self.what,
                self.refused,
                self.limits.max_connections,
            )
            self.refused, self._warned_at = 0, now
        return False


class LimitedProtocol(H2Protocol):
    """grpclib's HTTP/2 connection, held to its server's limits (`census`)."""

    def __init__(
        self,
        handler: AbstractHandler,
        config: Configuration,
        h2_config: H2Configuration,
        census: Census,
    ) -> None:
        super().__init__(handler, config, h2_config)
        self.census, self.limits = census, census.limits
        self.refused = False
        self.streams = 0  # open now
        self._timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._closed = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(Coalesced(transport))
        h2 = self.connection._connection
        # Sent right behind grpclib's own SETTINGS; it holds once the peer acknowledges
        # it, which comes before any stream the peer opens after reading it.
        h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: self.limits.max_streams})
        self.connection.flush()
        self.processor = _Processor(self.handler, self.connection, self)
        self.refused = not self.census.admit(self)
        self._arm(self.limits.header_timeout, "no request headers in time")

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        self.census.open.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    def stream_opened(self) -> None:
        self.streams += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stream_closed(self) -> None:
        self.streams -= 1
        if not self.streams and not self.refused:
            self._arm(self.limits.idle_timeout, "idle")

    def refuse(self, stream_id: int) -> None:
        """Answer a request on a connection over the limit, without running it."""
        headers = [
            (":status", "200"),
            ("content-type", "application/grpc+proto"),
            ("grpc-status", str(Status.RESOURCE_EXHAUSTED.value)),
            ("grpc-message", encode_grpc_message(self.census.refusal)),
        ]
        try:
            self.connection._connection.send_headers(stream_id, headers, end_stream=True)
        except ProtocolError:
            log.debug("could not refuse stream %d", stream_id, exc_info=True)
        if not self._lingering:
            self._lingering = True
            self._arm(REFUSED_LINGER, "refused")

    def _arm(self, delay: float, why: str) -> None:
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire, why)

    def _expire(self, why: str) -> None:
        self._timer = None
        if self._closed:
            return
        log.debug("%s closes a connection: %s", self.census.what, why)
        try:
            # GOAWAY first: a grpclib client then opens a new connection for its
            # next call instead of sending it into this one.
            self.connection._connection.close_connection(ErrorCodes.NO_ERROR)
            self.connection.flush()
        except (ProtocolError, AttributeError):
            pass  # closed under us, or the peer never got as far as HTTP/2
        self.processor.close(f"connection closed: {why}")


class _Processor(EventsProcessor):
    """grpclib's event processor, telling its protocol when streams open and end, and
    refusing them when the connection is over the limit."""

    def __init__(
        self, handler: AbstractHandler, connection: Connection, protocol: LimitedProtocol
    ) -> None:
        super().__init__(handler, connection)
        self._protocol = protocol

    def register(self, stream: Stream) -> Callable[[], None]:
        release = super().register(stream)
        self._protocol.stream_opened()

        def release_stream() -> None:
            try:
                release()
            finally:
                self._protocol.stream_closed()

        return release_stream

    def process_request_received(self, event: RequestReceived) -> None:
        if self._protocol.refused:
            assert event.stream_id is not None
            self._protocol.refuse(event.stream_id)
            return
        super().process_request_received(event)
