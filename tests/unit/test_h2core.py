"""The HTTP/2 server connection, driven by h2's client connection as the peer: what
a well-behaved client sends is understood and what it is sent parses; what a
hostile or broken one sends ends its stream or its connection, never more."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typing import Any

from timeslice.api.h2core import (
    PREFACE,
    ConnectionClosed,
    DataReceived,
    ErrorCode,
    Event,
    FrameType,
    Limits,
    RequestReceived,
    ServerConnection,
    StreamEnded,
    StreamReset,
    StreamWritable,
    frame,
)
from timeslice.api.header_blocks import header_block

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/pkg.Service/Method"),
    (":authority", "localhost"),
    ("te", "trailers"),
    ("content-type", "application/grpc"),
]
RESPONSE = header_block([(":status", "200"), ("content-type", "application/grpc")])
OK = header_block([("grpc-status", "0")])


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The frames in `data`: (type, flags, stream, payload) each."""
    out = []
    while data:
        n = int.from_bytes(data[:3], "big")
        out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9 : 9 + n]))
        data = data[9 + n :]
    return out


class Pair:
    """Our server connection and h2's client connection, wired back to back."""

    def __init__(self, limits: Limits | None = None, clock: list[float] | None = None) -> None:
        now = clock or [0.0]
        self.server = ServerConnection(limits, clock=lambda: now[0])
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=True,
                header_encoding="utf-8",
                # it sends what a broken client would, where a test says so
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        self.client.initiate_connection()
        self.server_events: list[Event] = []
        self.client_events: list[h2.events.Event] = []
        self.pump()

    def pump(self) -> None:
        """Deliver what each side has to send until both are quiet."""
        while True:
            to_server = self.client.data_to_send()
            if to_server:
                self.server_events += self.server.receive(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                self.client_events += self.client.receive_data(to_client)
            if not to_server and not to_client:
                return

    def raw(self, data: bytes) -> list[Event]:
        """Bytes straight to the server (what h2 would refuse to send)."""
        events = self.server.receive(data)
        self.server_events += events
        return events

    def request(self, body: bytes = b"", end: bool = True) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, REQUEST, end_stream=not body and end)
        if body:
            self.client.send_data(sid, body, end_stream=end)
        self.pump()
        return sid

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.server_events if isinstance(e, kind)]

    def client_of(self, kind: type) -> list[Any]:
        return [e for e in self.client_events if isinstance(e, kind)]

    def goaway(self) -> ConnectionClosed:
        closed = self.of(ConnectionClosed)
        assert len(closed) == 1, self.server_events
        terminated = self.client_of(h2.events.ConnectionTerminated)
        assert [t.error_code for t in terminated] == [closed[0].code]
        first: ConnectionClosed = closed[0]
        return first


def test_a_request_and_its_response_go_through_and_parse() -> None:
    pair = Pair()
    sid = pair.request(b"\0\0\0\0\x03abc")
    [request] = pair.of(RequestReceived)
    assert request.stream_id == sid and request.headers == REQUEST and not request.ended
    [data] = pair.of(DataReceived)
    assert data.data == b"\0\0\0\0\x03abc" and data.ended
    pair.server.respond(sid, RESPONSE)
    assert pair.server.send_data(sid, b"\0\0\0\0\x02ok")
    pair.server.end(sid, OK)
    pair.pump()
    [response] = pair.client_of(h2.events.ResponseReceived)
    assert response.headers == [(":status", "200"), ("content-type", "application/grpc")]
    [body] = pair.client_of(h2.events.DataReceived)
    assert body.data == b"\0\0\0\0\x02ok"
    [trailers] = pair.client_of(h2.events.TrailersReceived)
    assert trailers.headers == [("grpc-status", "0")]
    assert pair.client_of(h2.events.StreamEnded)
    assert not pair.server.is_open(sid) and pair.server.open_streams == 0


def test_a_trailers_only_response_and_client_trailers() -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, REQUEST)
    pair.client.send_data(sid, b"x")
    pair.client.send_headers(sid, [("x-trailer", "1")], end_stream=True)
    pair.pump()
    assert [e.stream_id for e in pair.of(StreamEnded)] == [sid]
    pair.server.respond(sid, header_block([(":status", "200"), ("grpc-status", "12")]), end=True)
    pair.pump()
    [response] = pair.client_of(h2.events.ResponseReceived)
    assert ("grpc-status", "12") in response.headers
    assert pair.client_of(h2.events.StreamEnded)


def test_long_values_need_multi_byte_integers_and_continuations() -> None:
    pair = Pair()
    sid = pair.request(b"")
    message = "é" * 20_000  # a value over a frame: HEADERS + CONTINUATION, long lengths
    pair.server.respond(sid, RESPONSE)
    pair.server.end(sid, header_block([("grpc-status", "2"), ("grpc-message", message)]))
    pair.pump()
    [trailers] = pair.client_of(h2.events.TrailersReceived)
    assert dict(trailers.headers)["grpc-message"] == message


def test_a_response_over_the_clients_window_waits_for_it() -> None:
    pair = Pair()
    sid = pair.request(b"")
    pair.server.respond(sid, RESPONSE)
    big = bytes(range(256)) * 1024  # 256 KiB, over the default 64 KiB windows
    assert not pair.server.send_data(sid, big)
    pair.server.end(sid, OK)
    pair.pump()
    first = pair.client_of(h2.events.DataReceived)
    assert sum(len(e.data) for e in first) == 65_535  # the client's default window, no more
    assert not pair.client_of(h2.events.TrailersReceived)
    # The client takes what it gets: its windows open, the rest follows, then trailers.
    received = b""
    for _ in range(100):
        got = pair.client_of(h2.events.DataReceived)
        done = pair.client_of(h2.events.TrailersReceived)
        pair.client_events.clear()
        for e in got:
            received += e.data
            pair.client.acknowledge_received_data(e.flow_controlled_length, sid)
        if done:
            break
        pair.pump()
    assert received == big
    assert pair.of(StreamWritable) == [StreamWritable(sid)]
    assert not pair.server.is_open(sid)


def test_a_stream_window_update_alone_lets_its_queued_data_go() -> None:
    pair = Pair()
    sid = pair.request(b"")
    pair.server.respond(sid, RESPONSE)
    assert not pair.server.send_data(sid, b"x" * 70_000)
    pair.server.end(sid, OK)
    pair.client.increment_flow_control_window(1_000_000)  # the connection's only
    pair.pump()

    def received() -> int:
        return sum(len(e.data) for e in pair.client_of(h2.events.DataReceived))

    assert received() == 65_535  # the stream's window still holds the rest
    assert pair.of(StreamWritable) == []
    pair.client.increment_flow_control_window(10_000, stream_id=sid)
    pair.pump()
    assert received() == 70_000
    assert pair.of(StreamWritable) == [StreamWritable(sid)]
    assert pair.client_of(h2.events.TrailersReceived)


def test_a_stream_nobody_reads_stops_at_its_window() -> None:
    window = 65_535
    pair = Pair(Limits(stream_window=window))
    sid = pair.request(b"")
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, REQUEST)
    pair.pump()
    assert pair.client.local_flow_control_window(sid) == window
    pair.client.send_data(sid, b"x" * 16_000)
    pair.client.send_data(sid, b"x" * 16_000)
    pair.client.send_data(sid, b"x" * 16_000)
    pair.client.send_data(sid, b"x" * 16_000)
    pair.pump()
    # nothing was taken: the client may send 1,535 bytes more, and no more
    assert pair.client.local_flow_control_window(sid) == window - 64_000
    # more than the window, sent anyway: the stream is reset, not the connection
    pair.raw(frame(FrameType.DATA, 0, sid, b"y" * 2000))
    [reset] = pair.of(StreamReset)
    assert reset.stream_id == sid and reset.code == ErrorCode.FLOW_CONTROL_ERROR
    assert pair.server.closed is None


def test_taking_the_bytes_gives_the_window_back() -> None:
    pair = Pair(Limits(stream_window=65_535))
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, REQUEST)
    for _ in range(4):
        pair.client.send_data(sid, b"x" * 16_000)
    pair.pump()
    pair.server.consumed(sid, 64_000)
    pair.pump()
    assert pair.client.local_flow_control_window(sid) == 65_535


def test_more_requests_than_allowed_are_refused() -> None:
    pair = Pair(Limits(max_streams=2))
    ids = [pair.request(b"x", end=False) for _ in range(2)]
    assert [e.stream_id for e in pair.of(RequestReceived)] == ids
    # h2's client keeps to the limit; a client that does not is refused
    pair.raw(frame(FrameType.HEADERS, 0x4, 5, header_block(REQUEST)))
    pair.raw(frame(FrameType.DATA, 0x1, 5, b"ignored"))  # sent before it knew
    assert pair.server.data_to_send() == frame(
        FrameType.RST_STREAM, 0, 5, ErrorCode.REFUSED_STREAM.to_bytes(4, "big")
    )
    assert [e.stream_id for e in pair.of(RequestReceived)] == ids
    assert {e.stream_id for e in pair.of(DataReceived)} == set(ids)


def test_a_client_reset_cancels_the_stream() -> None:
    pair = Pair()
    sid = pair.request(b"x", end=False)
    pair.client.reset_stream(sid, error_code=8)
    pair.pump()
    assert pair.of(StreamReset) == [StreamReset(sid, 8, by_peer=True)]
    with pytest.raises(KeyError):
        pair.server.respond(sid, RESPONSE)


def test_a_ping_is_answered() -> None:
    pair = Pair()
    pair.client.ping(b"12345678")
    pair.pump()
    [ack] = pair.client_of(h2.events.PingAckReceived)
    assert ack.ping_data == b"12345678"


@pytest.mark.parametrize(
    "flood",
    [
        frame(FrameType.PING, 0, 0, b"12345678"),
        frame(FrameType.SETTINGS, 0, 0),
        frame(FrameType.PRIORITY, 0, 1, b"\0\0\0\0\x10"),
        frame(FrameType.DATA, 0, 1, b""),
    ],
    ids=["ping", "settings", "priority", "empty-data"],
)
def test_a_flood_of_frames_that_cost_only_the_server_ends_the_connection(flood: bytes) -> None:
    clock = [0.0]
    pair = Pair(Limits(calm_budget=50, calm_seconds=1.0), clock=clock)
    pair.request(b"", end=False)  # stream 1, for the DATA flood
    for _ in range(50):
        pair.raw(flood)
    assert pair.server.closed is None
    clock[0] = 2.0  # a new period: the budget is back
    for _ in range(50):
        pair.raw(flood)
    assert pair.server.closed is None
    pair.raw(flood * 51)
    pair.pump()
    assert pair.goaway().code == ErrorCode.ENHANCE_YOUR_CALM


def test_rapid_reset_ends_the_connection() -> None:
    pair = Pair(Limits(calm_budget=20))
    for _ in range(25):
        sid = pair.client.get_next_available_stream_id()
        pair.client.send_headers(sid, REQUEST)
        pair.client.reset_stream(sid)
        pair.pump()
        if pair.server.closed is not None:
            break
    assert pair.goaway().code == ErrorCode.ENHANCE_YOUR_CALM


def test_a_header_block_over_the_limit_ends_the_connection() -> None:
    pair = Pair(Limits(max_header_block=16_384))
    pair.raw(frame(FrameType.HEADERS, 0, 1, b"\0" * 16_000))
    for _ in range(3):
        pair.raw(frame(FrameType.CONTINUATION, 0, 1, b"\0" * 1000))
    pair.pump()
    assert pair.goaway().code == ErrorCode.ENHANCE_YOUR_CALM


def test_a_header_list_over_the_limit_ends_the_connection() -> None:
    pair = Pair(Limits(max_header_list_size=1000))
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, [*REQUEST, ("x-big", "v" * 2000)])
    pair.pump()
    assert pair.goaway().code == ErrorCode.COMPRESSION_ERROR
    assert not pair.of(RequestReceived)


@pytest.mark.parametrize(
    "headers",
    [
        [(":method", "POST"), (":path", "/x")],  # no :scheme
        [*REQUEST, (":path", "/again")],  # a pseudo-header after regular ones
        [*REQUEST[:4], ("connection", "close")],
        [*REQUEST[:4], ("te", "gzip")],
        [*REQUEST[:4], (":status", "200")],
    ],
)
def test_a_malformed_request_resets_its_stream_only(headers: list[tuple[str, str]]) -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, headers, end_stream=True)
    pair.pump()
    assert not pair.of(RequestReceived)
    resets = pair.client_of(h2.events.StreamReset)
    assert [(r.stream_id, r.error_code) for r in resets] == [(sid, ErrorCode.PROTOCOL_ERROR)]
    assert pair.server.closed is None
    pair.request(b"")  # the connection still serves
    assert len(pair.of(RequestReceived)) == 1


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(FrameType.HEADERS, 0x4, 2, b"\x88"), ErrorCode.PROTOCOL_ERROR),  # even id
        (frame(FrameType.PUSH_PROMISE, 0x4, 1, b"\0\0\0\x02"), ErrorCode.PROTOCOL_ERROR),
        (frame(FrameType.DATA, 0, 99, b"x"), ErrorCode.PROTOCOL_ERROR),  # idle stream
        (frame(FrameType.PING, 0, 0, b"short"), ErrorCode.FRAME_SIZE_ERROR),
        (frame(FrameType.SETTINGS, 0, 0, b"\0\x04\xff\xff\xff\xff"), ErrorCode.FLOW_CONTROL_ERROR),
        (frame(FrameType.SETTINGS, 0, 0, b"\0\x05\0\0\0\x01"), ErrorCode.PROTOCOL_ERROR),
        (frame(FrameType.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), ErrorCode.PROTOCOL_ERROR),
        (frame(FrameType.WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"), ErrorCode.FLOW_CONTROL_ERROR),
        (frame(FrameType.HEADERS, 0x4, 1, b"\xff\xff\xff\xff\x0f"), ErrorCode.COMPRESSION_ERROR),
        (
            frame(FrameType.HEADERS, 0x0, 1, b"") + frame(FrameType.PING, 0, 0, bytes(8)),
            ErrorCode.PROTOCOL_ERROR,
        ),  # a header block interrupted
        (b"\0\x40\x01" + bytes(6) + bytes(0x4001), ErrorCode.FRAME_SIZE_ERROR),
    ],  # fmt: skip
)
def test_a_connection_error_ends_the_connection_with_goaway(data: bytes, code: ErrorCode) -> None:
    pair = Pair()
    pair.raw(data)
    pair.pump()
    assert pair.goaway().code == code
    assert pair.raw(frame(FrameType.PING, 0, 0, bytes(8))) == []  # nothing more is read


def test_a_wrong_preface_is_refused_at_once() -> None:
    server = ServerConnection()
    [closed] = server.receive(b"GET / HTTP/1.1\r\n")
    assert isinstance(closed, ConnectionClosed) and closed.code == ErrorCode.PROTOCOL_ERROR
    server = ServerConnection()
    assert server.receive(PREFACE[:10]) == []  # a preface in pieces is fine
    [closed] = server.receive(PREFACE[10:] + frame(FrameType.PING, 0, 0, bytes(8)))
    assert isinstance(closed, ConnectionClosed)
    assert closed.reason == "the preface is not a SETTINGS frame"


def test_a_client_that_does_not_read_is_dropped() -> None:
    pair = Pair(Limits(max_unsent=64 * 1024, calm_budget=10**9))
    for _ in range(10_000):
        pair.raw(frame(FrameType.PING, 0, 0, bytes(8)))  # answers pile up unread
        if pair.server.closed is not None:
            break
    assert pair.server.closed is not None
    assert pair.server.closed.code == ErrorCode.ENHANCE_YOUR_CALM


def test_the_clients_initial_window_change_applies_to_open_streams() -> None:
    pair = Pair()
    sid = pair.request(b"")
    pair.server.respond(sid, RESPONSE)
    pair.server.send_data(sid, b"x" * 70_000)
    pair.pump()
    assert pair.server.send_window(sid) == 0
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 200_000})
    pair.client.increment_flow_control_window(200_000)
    pair.pump()
    received = sum(len(e.data) for e in pair.client_of(h2.events.DataReceived))
    assert received == 70_000


def test_go_away_lets_the_streams_under_way_finish() -> None:
    pair = Pair()
    sid = pair.request(b"")
    pair.server.go_away()
    pair.pump()
    # h2's client opens nothing after it; a client that does is not served
    pair.raw(frame(FrameType.HEADERS, 0x5, sid + 2, header_block(REQUEST)))
    assert [e.stream_id for e in pair.of(RequestReceived)] == [sid]
    pair.server.respond(sid, RESPONSE)
    pair.server.end(sid, OK)
    # (h2's client takes no frame after a GOAWAY: the frames are read here)
    assert frames(pair.server.data_to_send()) == [
        (FrameType.HEADERS, 0x4, sid, RESPONSE),
        (FrameType.HEADERS, 0x5, sid, OK),
    ]


def _client_bytes() -> st.SearchStrategy[bytes]:
    kinds = st.sampled_from([*FrameType, 0x0A, 0xFF])
    frames = st.builds(
        lambda kind, flags, sid, payload: frame(kind, flags, sid, payload),
        kinds,
        st.integers(0, 255),
        st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
        st.binary(max_size=64),
    )
    return st.lists(frames, max_size=20).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_no_bytes_a_client_sends_break_the_server(data: st.DataObject) -> None:
    pair = Pair(Limits(max_streams=3))
    pair.request(b"\0\0\0\0\x01x", end=False)
    garbage = data.draw(_client_bytes())
    cuts = sorted(data.draw(st.lists(st.integers(0, len(garbage)), max_size=4)))
    pieces = [garbage[a:b] for a, b in zip([0, *cuts], [*cuts, len(garbage)], strict=True)]
    for piece in pieces:
        for event in pair.raw(piece):
            assert isinstance(
                event,
                RequestReceived
                | DataReceived
                | StreamEnded
                | StreamReset
                | StreamWritable
                | ConnectionClosed,
            )
    assert pair.server.open_streams <= 3
    out = pair.server.data_to_send()
    # whatever the server answered is valid HTTP/2 for the client, or it said GOAWAY
    try:
        pair.client.receive_data(out)
    except h2.exceptions.ProtocolError:
        assert pair.server.closed is not None
