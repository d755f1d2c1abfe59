"""Both ends of an HTTP/2 connection (RFC 9113) as gRPC uses it, with no I/O.

`receive(bytes) -> list[event]` parses what the peer sent and answers what HTTP/2
answers by itself (SETTINGS and PING acknowledgements, window updates, resets and
GOAWAY for what breaks the protocol); `data_to_send()` takes the bytes to write, so
that whatever one turn of the caller's loop produced leaves in one write.
`ServerConnection` takes requests (`respond`, `send_data` and `end` queue a
response); `ClientConnection` sends them (`request` queues a whole unary request:
headers, message and the end of the stream) and reads the responses. Both share
one frame parser and the same checks: what a peer may do to one, it may do to the
other.

What it keeps small, for a hostile peer as much as a careless one (a server's
client, or the server a client calls):
- every frame is checked against the protocol before it changes anything, and a
  violation ends the stream (RST_STREAM) or the connection (GOAWAY), never the server;
- frames are at most `max_frame_size`, a header block at most `max_header_block`
  bytes across its CONTINUATIONs, the decoded header list at most
  `max_header_list_size`, and at most `max_streams` requests run at once (more are
  refused with REFUSED_STREAM, the client may retry them);
- a stream's received bytes count against its window until the reader says it took
  them (`consumed`): a stream nobody reads stops at `stream_window` bytes;
- frames that only cost the receiver work (PING, SETTINGS, empty DATA frames, and
  on a server resets of streams it was still serving) are counted, and a peer that
  sends more of them than `calm_budget` within `calm_seconds` is told
  ENHANCE_YOUR_CALM and dropped;
- what waits to be written is bounded too: a peer that sends but does not read
  is dropped once `max_unsent` bytes wait for it.

Header blocks are written and read by `timeslice.api.header_blocks`: what
either end sends uses no dynamic table, so every constant block is the same
bytes on every connection; what it receives is read there in one pass when it is
of that plain kind, and by `hpack` (the decoder h2 uses) when it is not.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hpack.exceptions import HPACKError

from timeslice.api.header_blocks import BlockReader

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MAX_WINDOW = 2**31 - 1
_DEFAULT_WINDOW = 65_535
_DEFAULT_FRAME = 16_384


class FrameType(enum.IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Headers a request must not carry (RFC 9113 8.2.2): they belong to HTTP/1.1.
_CONNECTION_HEADERS = frozenset(
    ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade")
)
_REQUEST_PSEUDO = frozenset((":method", ":scheme", ":path", ":authority"))
_RESPONSE_PSEUDO = frozenset((":status",))


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one connection may hold or cost; see the module's docstring. On a client,
    `max_streams` bounds its own requests at once (and the server's setting too)."""

    max_streams: int = 100
    stream_window: int = 256 * 1024
    connection_window: int = 4 * 1024 * 1024
    max_frame_size: int = _DEFAULT_FRAME
    max_header_list_size: int = 16 * 1024
    max_header_block: int = 32 * 1024
    header_table_size: int = 4096
    max_unsent: int = 8 * 1024 * 1024
    calm_budget: int = 2000
    calm_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_streams <= 2**31 - 1:
            raise ValueError("max_streams must be at least 1")
        for name in ("stream_window", "connection_window"):
            if not _DEFAULT_WINDOW <= getattr(self, name) <= _MAX_WINDOW:
                raise ValueError(f"{name} must be from {_DEFAULT_WINDOW} to {_MAX_WINDOW}")
        if not _DEFAULT_FRAME <= self.max_frame_size <= 2**24 - 1:
            raise ValueError(f"max_frame_size must be from {_DEFAULT_FRAME} to {2**24 - 1}")
        if self.max_header_block < self.max_frame_size // 2:
            raise ValueError("max_header_block must hold at least half a frame")


# --- events: what the peer did, for the caller to act on ---------------------------------


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A new stream's request headers (pseudo-headers first, names lower case)."""

    stream_id: int
    headers: list[tuple[str, str]]
    ended: bool  # the request has no body (END_STREAM on its headers)


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A client's stream got its response headers (pseudo-headers first); `ended`:
    a trailers-only response, the stream is over."""

    stream_id: int
    headers: list[tuple[str, str]]
    ended: bool


@dataclass(frozen=True, slots=True)
class TrailersReceived:
    """A client's stream got the trailers that end its response."""

    stream_id: int
    headers: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class DataReceived:
    """Body bytes of a stream; call `consumed` once they are taken, to let more in."""

    stream_id: int
    data: bytes
    ended: bool


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The client ended its side of the stream with trailers (or empty headers)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamReset:
    """The stream is over, before its response ended: reset by the peer, or by
    this connection for a protocol error of the stream's (`code`). On a client, a
    stream the server refused (REFUSED_STREAM, or above its GOAWAY's last stream)
    was not processed: it may be sent again."""

    stream_id: int
    code: int
    by_peer: bool


@dataclass(frozen=True, slots=True)
class StreamWritable:
    """Everything queued on the stream has been sent (it waited for a window)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class PingAcknowledged:
    """The peer answered a PING this end sent (`ClientConnection.ping`)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over: GOAWAY is queued (or received); write what is left
    and close. Every stream still open is over too."""

    code: int
    reason: str
    by_peer: bool


Event = (
    RequestReceived
    | ResponseReceived
    | TrailersReceived
    | DataReceived
    | StreamEnded
    | StreamReset
    | StreamWritable
    | PingAcknowledged
    | ConnectionClosed
)


class ProtocolViolation(Exception):
    """A connection error: the connection ends with GOAWAY `code`."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _StreamViolation(Exception):
    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


# --- the encoding of what either end sends ----------------------------------------------


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: the 9-byte header, then `payload`."""
    n = len(payload)
    return (
        bytes((n >> 16, (n >> 8) & 0xFF, n & 0xFF, kind, flags))
        + (stream_id & _MAX_WINDOW).to_bytes(4, "big")
        + payload
    )


def _rst(stream_id: int, code: ErrorCode) -> bytes:
    """A RST_STREAM frame ending `stream_id` with `code`."""
    return frame(FrameType.RST_STREAM, 0, stream_id, int(code).to_bytes(4, "big"))


# --- the connection ---------------------------------------------------------------------


@dataclass(slots=True)
class _Stream:
    stream_id: int
    send_window: int
    recv_window: int
    remote_open: bool = True  # the peer may still send (no END_STREAM yet)
    local_open: bool = True  # this end may still send
    headers_sent: bool = False  # this end's headers are queued (a server's response's)
    headers_received: bool = False  # a client's stream: the response headers came
    unacknowledged: int = 0  # received bytes the reader has not taken yet
    returnable: int = 0  # window the client may use again, not yet announced
    # What waits for a window (the stream is blocked while it is not empty): DATA
    # payloads, and the trailer block that goes after them (a server's), or the end
    # of the stream on the last of them (a client's).
    queue: deque[bytes] = field(default_factory=deque)
    trailers: bytes | None = None
    end_after: bool = False


class _Connection:
    """What both ends do alike; see the module's docstring."""

    #: Whether the peer's resets of streams are counted against `calm_budget`
    #: (a server's: "rapid reset").
    _COUNT_RESETS = False
    #: Whether this end waits for the client's connection preface (a server).
    _READS_PREFACE = False
    #: What this end is, in the reason of a GOAWAY it sends by `close`.
    _ROLE = "client"

    def __init__(self, limits: Limits | None = None, clock: Callable[[], float] | None = None):
        self.limits = limits or Limits()
        self._clock = clock or time.monotonic
        self._out = bytearray()
        self._buffer = bytearray()
        self._preface_seen = not self._READS_PREFACE
        self._settings_seen = False
        self._streams: dict[int, _Stream] = {}
        self._last_stream = 0  # the highest stream id opened (by the client)
        self._header_reader = BlockReader(
            self.limits.max_header_list_size, self.limits.header_table_size
        )
        self._block: bytearray | None = None  # a header block awaiting CONTINUATION
        self._block_stream = 0
        self._block_flags = 0
        self._peer_window = _DEFAULT_WINDOW  # the peer's initial stream window
        self._peer_frame = _DEFAULT_FRAME
        self._peer_streams = _MAX_WINDOW  # the peer's MAX_CONCURRENT_STREAMS
        self._send_window = _DEFAULT_WINDOW  # the connection's, for what we send
        self._recv_window = self.limits.connection_window
        self._recv_returnable = 0
        self._going_away = False
        self._calm_start = self._clock()
        self._calm_spent = 0
        self.closed: ConnectionClosed | None = None
        self._events: list[Event] = []
        self._handlers = {kind: getattr(self, name) for kind, name in _HANDLERS.items()}
        self._start()

    def _start(self) -> None:
        """Queue what this end sends first."""
        raise NotImplementedError

    # --- what the caller reads ----------------------------------------------------------

    def data_to_send(self) -> bytes:
        """The bytes to write now (and forget)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    @property
    def unsent(self) -> int:
        """How many bytes wait for `data_to_send`."""
        return len(self._out)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def send_window(self, stream_id: int) -> int:
        """How many DATA bytes the stream may send now."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else max(0, min(stream.send_window, self._send_window))

    # --- what the peer sent -------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """Take bytes the peer sent; the events they make, in order."""
        if self.closed is not None:
            return []
        self._buffer += data
        try:
            self._parse()
        except ProtocolViolation as exc:
            self._close(exc.code, exc.reason, by_peer=False)
        events, self._events = self._events, []
        return events

    def _parse(self) -> None:
        buffer = self._buffer
        if not self._preface_seen:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
                return
            if buffer[: len(PREFACE)] != PREFACE:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
            del buffer[: len(PREFACE)]
            self._preface_seen = True
        start = 0
        end = len(buffer)
        view = memoryview(buffer)
        try:
            while end - start >= 9 and self.closed is None:
                length = (buffer[start] << 16) | (buffer[start + 1] << 8) | buffer[start + 2]
                if length > self.limits.max_frame_size:
                    raise ProtocolViolation(
                        ErrorCode.FRAME_SIZE_ERROR,
                        f"a frame of {length} bytes is over {self.limits.max_frame_size}",
                    )
                if end - start < 9 + length:
                    break
                kind, flags = buffer[start + 3], buffer[start + 4]
                stream_id = int.from_bytes(buffer[start + 5 : start + 9], "big") & _MAX_WINDOW
                payload = bytes(view[start + 9 : start + 9 + length])
                start += 9 + length
                self._frame(kind, flags, stream_id, payload)
        finally:
            view.release()
            del buffer[:start]
        if len(self._out) > self.limits.max_unsent:
            raise ProtocolViolation(
                ErrorCode.ENHANCE_YOUR_CALM, "the peer does not read what it is sent"
            )

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if not self._settings_seen and kind != FrameType.SETTINGS:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "the preface is not a SETTINGS frame")
        if self._block is not None and kind != FrameType.CONTINUATION:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "a header block is interrupted")
        handler = self._handlers.get(kind)
        if handler is None:
            return  # an unknown frame type is ignored (RFC 9113 4.1)
        try:
            handler(flags, stream_id, payload)
        except _StreamViolation as exc:
            self._reset(stream_id, exc.code, by_peer=False)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        flow = len(payload)
        if flow > self._recv_window:
            raise ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "DATA over the connection window")
        # The connection's window is given back as soon as the bytes arrive: each
        # stream's own window bounds what waits unread, and the streams are bounded
        # in number. Announced in steps of a quarter window.
        self._recv_window -= flow
        self._recv_returnable += flow
        if self._recv_returnable >= self.limits.connection_window // 4:
            self._out += frame(
                FrameType.WINDOW_UPDATE, 0, 0, self._recv_returnable.to_bytes(4, "big")
            )
            self._recv_window += self._recv_returnable
            self._recv_returnable = 0
        data = _unpadded(flags, payload)
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already over: what the peer sent before it knew
        if not stream.remote_open:
            raise _StreamViolation(ErrorCode.STREAM_CLOSED, "DATA after the end of the stream")
        if flow > stream.recv_window:
            raise _StreamViolation(ErrorCode.FLOW_CONTROL_ERROR, "DATA over the stream window")
        stream.recv_window -= flow
        # Padding is taken at once; the data is the reader's to take (`consumed`).
        stream.unacknowledged += len(data)
        self._give_back(stream, flow - len(data))
        ended = bool(flags & END_STREAM)
        if not data and not ended:
            self._spend_calm("empty DATA frames")
        self._events.append(DataReceived(stream_id, data, ended))
        if ended:
            stream.remote_open = False
            self._remote_ended(stream)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = _unpadded(flags, payload)
        if flags & PRIORITY_FLAG:  # deprecated (RFC 9113 5.3.2): skipped
            if len(block) < 5:
                raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "HEADERS priority is short")
            block = block[5:]
        self._block_stream, self._block_flags = stream_id, flags
        self._block = bytearray(block)
        if flags & END_HEADERS:
            self._header_block_done()
        else:
            self._check_block_size()

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is None or stream_id != self._block_stream:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "CONTINUATION out of place")
        self._block += payload
        self._check_block_size()
        if flags & END_HEADERS:
            self._header_block_done()
        elif not payload:
            self._spend_calm("empty CONTINUATION frames")

    def _check_block_size(self) -> None:
        assert self._block is not None
        if len(self._block) > self.limits.max_header_block:
            raise ProtocolViolation(
                ErrorCode.ENHANCE_YOUR_CALM,
                f"a header block is over {self.limits.max_header_block} bytes",
            )

    def _header_block_done(self) -> None:
        block, self._block = bytes(self._block or b""), None
        stream_id, flags = self._block_stream, self._block_flags
        # Read whatever becomes of the stream: the decoder's table must follow
        # every block the peer encoded.
        try:
            headers = self._header_reader.read(block)
        except HPACKError as exc:
            raise ProtocolViolation(
                ErrorCode.COMPRESSION_ERROR, f"bad header block: {exc}"
            ) from None
        self._headers_received(stream_id, bool(flags & END_STREAM), headers)

    def _headers_received(
        self, stream_id: int, ended: bool, headers: list[tuple[str, str]]
    ) -> None:
        """A header block of `stream_id` came whole (decoded)."""
        raise NotImplementedError

    def _remote_ended(self, stream: _Stream) -> None:
        """The peer sent the end of `stream` (END_STREAM)."""

    def _local_ended(self, stream: _Stream) -> None:
        """This end queued the end of `stream`."""
        stream.local_open = False

    def _goaway_last(self) -> int:
        """The last stream id a GOAWAY of ours names: the highest the peer opened."""
        return 0

    def _ping_acknowledged(self, payload: bytes) -> None:
        """A PING acknowledgement came (a server sends no PING, so ignores them)."""

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY is short")
        self._peer_goes_away(
            int.from_bytes(payload[:4], "big") & _MAX_WINDOW, int.from_bytes(payload[4:8], "big")
        )

    def _peer_goes_away(self, last: int, code: int) -> None:
        self._close(code, "the peer went away", by_peer=True)

    def _on_priority(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
        self._spend_calm("PRIORITY frames")

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if stream_id > self._last_stream:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        # A stream opened and reset at once costs the server work and the client
        # nothing (the "rapid reset" attack): counted.
        if self._COUNT_RESETS:
            self._spend_calm("streams reset before their response")
        self._events.append(StreamReset(stream_id, int.from_bytes(payload, "big"), by_peer=True))

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        if self._settings_seen:
            self._spend_calm("SETTINGS frames")
        self._settings_seen = True
        for i in range(0, len(payload), 6):
            key = int.from_bytes(payload[i : i + 2], "big")
            value = int.from_bytes(payload[i + 2 : i + 6], "big")
            self._setting(key, value)
        self._out += frame(FrameType.SETTINGS, ACK, 0)

    def _setting(self, key: int, value: int) -> None:
        if key == Setting.ENABLE_PUSH and value > 1:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH is not 0 or 1")
        elif key == Setting.INITIAL_WINDOW_SIZE:
            if value > _MAX_WINDOW:
                raise ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too big")
            delta, self._peer_window = value - self._peer_window, value
            for stream in self._streams.values():
                stream.send_window += delta
                if stream.send_window > _MAX_WINDOW:
                    raise ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "a window overflows")
            if delta > 0:
                self._flush_blocked()
        elif key == Setting.MAX_FRAME_SIZE:
            if not _DEFAULT_FRAME <= value <= 2**24 - 1:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
            self._peer_frame = value
        elif key == Setting.MAX_CONCURRENT_STREAMS:
            self._peer_streams = value
        # The others do not bind an end that pushes nothing and indexes nothing;
        # unknown settings are ignored (RFC 9113 6.5.2).

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        # A client takes no push (ENABLE_PUSH 0), a server none at all.
        raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE is not taken")

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & ACK:
            self._ping_acknowledged(payload)
            return
        self._spend_calm("PING frames")
        self._out += frame(FrameType.PING, ACK, 0, payload)

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = int.from_bytes(payload, "big") & _MAX_WINDOW
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > _MAX_WINDOW:
                raise ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "the window overflows")
            self._flush_blocked()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if increment == 0:
            raise _StreamViolation(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        stream.send_window += increment
        if stream.send_window > _MAX_WINDOW:
            raise _StreamViolation(ErrorCode.FLOW_CONTROL_ERROR, "the stream window overflows")
        if stream.queue:
            self._flush(stream)

    # --- what this end sends -------------------------------------------------------------

    def consumed(self, stream_id: int, n: int) -> None:
        """The reader took `n` bytes of the stream's body: let as many more in."""
        stream = self._streams.get(stream_id)
        if stream is not None and n > 0:
            n = min(n, stream.unacknowledged)
            stream.unacknowledged -= n
            self._give_back(stream, n)

    # --- internals ----------------------------------------------------------------------

    def _initiate(self, streams: int) -> None:
        """Queue this end's SETTINGS (`streams`: how many streams the peer may open)
        and raise the connection's window."""
        limits = self.limits
        settings = b"".join(
            key.to_bytes(2, "big") + value.to_bytes(4, "big")
            for key, value in (
                (Setting.ENABLE_PUSH, 0),
                (Setting.MAX_CONCURRENT_STREAMS, streams),
                (Setting.INITIAL_WINDOW_SIZE, limits.stream_window),
                (Setting.MAX_FRAME_SIZE, limits.max_frame_size),
                (Setting.MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
                (Setting.HEADER_TABLE_SIZE, limits.header_table_size),
            )
        )
        self._out += frame(FrameType.SETTINGS, 0, 0, settings)
        raise_by = limits.connection_window - _DEFAULT_WINDOW
        if raise_by:
            self._out += frame(FrameType.WINDOW_UPDATE, 0, 0, raise_by.to_bytes(4, "big"))

    def _open(self, stream_id: int) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise KeyError(f"stream {stream_id} is not open")
        return stream

    def _give_back(self, stream: _Stream, n: int) -> None:
        """Bytes of the stream's window the peer may use again: announced in steps
        of a quarter window, not one WINDOW_UPDATE per read."""
        if n <= 0 or not stream.remote_open:
            return
        stream.returnable += n
        if stream.returnable >= self.limits.stream_window // 4:
            stream.recv_window += stream.returnable
            self._out += frame(
                FrameType.WINDOW_UPDATE, 0, stream.stream_id, stream.returnable.to_bytes(4, "big")
            )
            stream.returnable = 0

    def _headers(self, stream_id: int, block: bytes, end: bool) -> None:
        flags = END_HEADERS | (END_STREAM if end else 0)
        size = self._peer_frame
        if len(block) <= size:
            self._out += frame(FrameType.HEADERS, flags, stream_id, block)
            return
        self._out += frame(FrameType.HEADERS, flags & END_STREAM, stream_id, block[:size])
        for i in range(size, len(block), size):
            last = i + size >= len(block)
            self._out += frame(
                FrameType.CONTINUATION, END_HEADERS if last else 0, stream_id, block[i : i + size]
            )

    def _send(self, stream: _Stream, data: bytes, end: bool = False) -> None:
        """Send what the windows allow of `data`, its last frame ending the stream if
        `end`; queue the rest."""
        sent = 0
        while sent < len(data):
            room = min(stream.send_window, self._send_window, self._peer_frame, len(data) - sent)
            if room <= 0:
                stream.queue.append(data[sent:])
                return
            last = end and sent + room == len(data)
            self._out += frame(
                FrameType.DATA,
                END_STREAM if last else 0,
                stream.stream_id,
                data[sent : sent + room],
            )
            stream.send_window -= room
            self._send_window -= room
            sent += room
        if end:
            self._local_ended(stream)

    def _flush(self, stream: _Stream) -> None:
        queue, stream.queue = stream.queue, deque()
        while queue:
            chunk = queue.popleft()
            self._send(stream, chunk, end=stream.end_after and not queue)
            if stream.queue:
                stream.queue.extend(queue)
                return
        if stream.trailers is not None:
            self._headers(stream.stream_id, stream.trailers, True)
            stream.trailers = None
            self._local_ended(stream)
        self._events.append(StreamWritable(stream.stream_id))

    def _flush_blocked(self) -> None:
        for stream in [s for s in self._streams.values() if s.queue]:
            if self._send_window <= 0:
                return
            self._flush(stream)

    def close(self, code: ErrorCode = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """End the connection with GOAWAY; every stream still open ends with it."""
        self._close(code, reason or f"the {self._ROLE} is closing", by_peer=False)

    def _reset(self, stream_id: int, code: ErrorCode, by_peer: bool) -> None:
        if self._streams.pop(stream_id, None) is not None:
            self._events.append(StreamReset(stream_id, int(code), by_peer))
        self._out += _rst(stream_id, code)

    def _spend_calm(self, what: str) -> None:
        now = self._clock()
        if now - self._calm_start > self.limits.calm_seconds:
            self._calm_start, self._calm_spent = now, 0
        self._calm_spent += 1
        if self._calm_spent > self.limits.calm_budget:
            raise ProtocolViolation(
                ErrorCode.ENHANCE_YOUR_CALM,
                f"too many {what}: over {self.limits.calm_budget} in "
                f"{self.limits.calm_seconds:g} s",
            )

    def _close(self, code: int, reason: str, by_peer: bool) -> None:
        if self.closed is not None:
            return
        if not by_peer:
            payload = self._goaway_last().to_bytes(4, "big") + int(code).to_bytes(4, "big")
            self._out += frame(FrameType.GOAWAY, 0, 0, payload + reason.encode()[:256])
        for stream_id in list(self._streams):
            self._events.append(StreamReset(stream_id, int(ErrorCode.CANCEL), by_peer))
        self._streams.clear()
        self.closed = ConnectionClosed(int(code), reason, by_peer)
        self._events.append(self.closed)


class ServerConnection(_Connection):
    """One client's connection, seen from the server; see the module's docstring."""

    _COUNT_RESETS = True
    _READS_PREFACE = True
    _ROLE = "server"

    def _start(self) -> None:
        self._initiate(self.limits.max_streams)

    def respond(self, stream_id: int, block: bytes, end: bool = False) -> None:
        """Queue the response headers (an HPACK block, see `header_block`)."""
        stream = self._open(stream_id)
        if stream.headers_sent:
            raise RuntimeError(f"stream {stream_id} has its response headers already")
        stream.headers_sent = True
        self._headers(stream_id, block, end)
        if end:
            self._local_ended(stream)

    def send_data(self, stream_id: int, data: bytes) -> bool:
        """Queue body bytes; False if (some of) it waits for the client's window
        (a `StreamWritable` follows once it has all gone)."""
        stream = self._open(stream_id)
        if not stream.headers_sent:
            raise RuntimeError(f"stream {stream_id} sends data before its headers")
        if stream.queue:
            stream.queue.append(data)
        else:
            self._send(stream, data)
        return not stream.queue

    def end(self, stream_id: int, trailers: bytes) -> None:
        """End the response with a trailer block (after whatever data is queued)."""
        stream = self._open(stream_id)
        if not stream.headers_sent:
            raise RuntimeError(f"stream {stream_id} ends before its headers")
        if stream.queue:
            stream.trailers = trailers
            return
        self._headers(stream_id, trailers, True)
        self._local_ended(stream)

    def go_away(self) -> None:
        """Tell the client no new stream will be taken (GOAWAY, NO_ERROR), and let
        the streams under way finish; `close` afterwards."""
        if self.closed is None and not self._going_away:
            self._going_away = True
            payload = (2**31 - 1).to_bytes(4, "big") + bytes(4)
            self._out += frame(FrameType.GOAWAY, 0, 0, payload)

    def _goaway_last(self) -> int:
        return self._last_stream

    def _headers_received(
        self, stream_id: int, ended: bool, headers: list[tuple[str, str]]
    ) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers: the end of what the client sends
            if not stream.remote_open:
                raise _StreamViolation(ErrorCode.STREAM_CLOSED, "HEADERS after the end")
            _check_trailers(ended, headers)
            stream.remote_open = False
            self._events.append(StreamEnded(stream_id))
            return
        if stream_id <= self._last_stream:
            return  # a stream already over (reset, or trailers the client sent late)
        self._last_stream = stream_id
        if self._going_away:
            return  # after our GOAWAY: not processed, the client may retry it
        if len(self._streams) >= self.limits.max_streams:
            self._out += _rst(stream_id, ErrorCode.REFUSED_STREAM)
            return
        if reason := _malformed(headers):
            self._out += _rst(stream_id, ErrorCode.PROTOCOL_ERROR)
            self._spend_calm(f"malformed requests ({reason})")
            return
        self._streams[stream_id] = _Stream(
            stream_id,
            send_window=self._peer_window,
            recv_window=self.limits.stream_window,
            remote_open=not ended,
        )
        self._events.append(RequestReceived(stream_id, headers, ended))

    def _local_ended(self, stream: _Stream) -> None:
        """The response has ended; the stream is over once the client's side is too.
        A client still sending is told to stop (RST_STREAM NO_ERROR, RFC 9113 8.1)."""
        stream.local_open = False
        self._streams.pop(stream.stream_id, None)
        if stream.remote_open:
            self._out += _rst(stream.stream_id, ErrorCode.NO_ERROR)


class ClientConnection(_Connection):
    """A connection to a server, seen from the client; see the module's docstring.

    `request` opens a stream with a whole request; the server's answer comes as a
    `ResponseReceived`, `DataReceived`s and a `TrailersReceived` (or a
    `StreamReset`). Stream ids are odd and rise; once they run out, or the server
    said GOAWAY, the connection takes no new request (`accepts_requests`)."""

    def _start(self) -> None:
        self._out += PREFACE
        self._initiate(0)  # a server opens no stream of its own (no push)
        self._next_stream = 1

    @property
    def accepts_requests(self) -> bool:
        """Whether `request` may open a stream now: the connection is open, the
        server did not say GOAWAY, and a stream id is left."""
        return self.closed is None and not self._going_away and self._next_stream <= _MAX_WINDOW

    @property
    def has_room(self) -> bool:
        """Whether one more stream is within both ends' limits on streams at once."""
        return len(self._streams) < min(self.limits.max_streams, self._peer_streams)

    def request(self, block: bytes, body: bytes) -> int:
        """Open a stream with request headers `block` (see `header_block`) and `body`,
        which ends it (on the last DATA frame; what the server's window cannot take
        yet waits for it). The new stream's id; RuntimeError if the connection takes
        no request now (`accepts_requests`, `has_room`)."""
        if not self.accepts_requests:
            raise RuntimeError("the connection takes no new request")
        if not self.has_room:
            raise RuntimeError("the connection has as many streams open as it may")
        stream_id, self._next_stream = self._next_stream, self._next_stream + 2
        self._last_stream = stream_id
        stream = _Stream(
            stream_id,
            send_window=self._peer_window,
            recv_window=self.limits.stream_window,
            headers_sent=True,
        )
        self._streams[stream_id] = stream
        if not body:
            self._headers(stream_id, block, True)
            self._local_ended(stream)
            return stream_id
        self._headers(stream_id, block, False)
        stream.end_after = True
        self._send(stream, body, end=True)
        return stream_id

    def ping(self, payload: bytes) -> None:
        """Send a PING of 8 bytes; a `PingAcknowledged` with them follows its answer."""
        if len(payload) != 8:
            raise ValueError("a PING carries 8 bytes")
        if self.closed is None:
            self._out += frame(FrameType.PING, 0, 0, payload)

    def _ping_acknowledged(self, payload: bytes) -> None:
        self._spend_calm("PING acknowledgements")  # one per ping sent, unless hostile
        self._events.append(PingAcknowledged(payload))

    def cancel(self, stream_id: int) -> None:
        """Give up on a stream (RST_STREAM CANCEL); nothing more of it is told."""
        if self._streams.pop(stream_id, None) is not None:
            self._out += _rst(stream_id, ErrorCode.CANCEL)

    def _headers_received(
        self, stream_id: int, ended: bool, headers: list[tuple[str, str]]
    ) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream:
                raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "HEADERS on an idle stream")
            return  # a stream already over (cancelled, or reset)
        if not stream.remote_open:
            raise _StreamViolation(ErrorCode.STREAM_CLOSED, "HEADERS after the end")
        if not stream.headers_received:
            if reason := _malformed_response(headers):
                raise _StreamViolation(ErrorCode.PROTOCOL_ERROR, f"a malformed response ({reason})")
            stream.headers_received = True
            self._events.append(ResponseReceived(stream_id, headers, ended))
        else:
            _check_trailers(ended, headers)
            self._events.append(TrailersReceived(stream_id, headers))
        if ended:
            stream.remote_open = False
            self._remote_ended(stream)

    def _remote_ended(self, stream: _Stream) -> None:
        """The response is over: so is the stream. A request still being sent stops
        (RST_STREAM CANCEL: nobody reads the rest)."""
        self._streams.pop(stream.stream_id, None)
        if stream.local_open:
            self._out += _rst(stream.stream_id, ErrorCode.CANCEL)

    def _local_ended(self, stream: _Stream) -> None:
        stream.local_open = False
        stream.end_after = False

    def _peer_goes_away(self, last: int, code: int) -> None:
        """GOAWAY: with an error, the connection is over; with NO_ERROR the server
        finishes the streams up to `last` and refuses (unprocessed) those above."""
        if code != ErrorCode.NO_ERROR:
            self._close(code, f"the server went away ({code_name(code)})", by_peer=True)
            return
        self._going_away = True
        for stream_id in [sid for sid in self._streams if sid > last]:
            del self._streams[stream_id]
            self._events.append(StreamReset(stream_id, int(ErrorCode.REFUSED_STREAM), True))


def _unpadded(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload:
        raise ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "a padded frame without its length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


def _check_trailers(ended: bool, headers: list[tuple[str, str]]) -> None:
    """Trailers end their stream and carry no pseudo-header (RFC 9113 8.1)."""
    if not ended:
        raise _StreamViolation(ErrorCode.PROTOCOL_ERROR, "trailers without END_STREAM")
    if any(name.startswith(":") for name, _ in headers):
        raise _StreamViolation(ErrorCode.PROTOCOL_ERROR, "a pseudo-header in trailers")


def code_name(code: int) -> str:
    """The name of an HTTP/2 error code ("error N" for one RFC 9113 does not name)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


def _malformed_response(headers: list[tuple[str, str]]) -> str:
    """Why a response's headers break RFC 9113 8.3.2, or ""."""
    status = False
    for i, (name, _) in enumerate(headers):
        if name.startswith(":"):
            if name not in _RESPONSE_PSEUDO or status or i:
                return f"pseudo-header {name}"
            status = True
        elif name != name.lower():
            return "an upper-case header name"
        elif name in _CONNECTION_HEADERS:
            return f"header {name}"
    return "" if status else "no :status"


def _malformed(headers: list[tuple[str, str]]) -> str:
    """Why a request's headers break RFC 9113 8.3.1, or ""."""
    seen: set[str] = set()
    regular = False
    for name, value in headers:
        if name.startswith(":"):
            if regular:
                return "a pseudo-header after a regular one"
            if name not in _REQUEST_PSEUDO or name in seen:
                return f"pseudo-header {name}"
            seen.add(name)
        else:
            regular = True
            if name != name.lower():
                return "an upper-case header name"
            if name in _CONNECTION_HEADERS or (name == "te" and value != "trailers"):
                return f"header {name}"
    if not {":method", ":scheme", ":path"} <= seen:
        return "a pseudo-header is missing"
    return ""


# The frame types each end reads, and the method that reads each.
_HANDLERS: dict[int, str] = {
    FrameType.DATA: "_on_data",
    FrameType.HEADERS: "_on_headers",
    FrameType.PRIORITY: "_on_priority",
    FrameType.RST_STREAM: "_on_rst_stream",
    FrameType.SETTINGS: "_on_settings",
    FrameType.PUSH_PROMISE: "_on_push_promise",
    FrameType.PING: "_on_ping",
    FrameType.GOAWAY: "_on_goaway",
    FrameType.WINDOW_UPDATE: "_on_window_update",
    FrameType.CONTINUATION: "_on_continuation",
}
