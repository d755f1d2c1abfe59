"""The HTTP/2 client connection, driven by h2's server connection as the peer (and
by our own server connection): a request and its answer go through; the peer's
windows, stream limit and GOAWAY are kept to; what a hostile or broken server sends
ends the stream or the connection, never more."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
from hypothesis import given, settings
from hypothesis import strategies as st

from timeslice.api.h2core import (
    ClientConnection,
    ConnectionClosed,
    DataReceived,
    ErrorCode,
    Event,
    FrameType,
    Limits,
    RequestReceived,
    ResponseReceived,
    ServerConnection,
    StreamEnded,
    StreamReset,
    StreamWritable,
    TrailersReceived,
    frame,
)
from timeslice.api.header_blocks import header_block

REQUEST = header_block(
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pkg.Service/Method"),
        (":authority", "localhost"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
    ]
)
RESPONSE = [(":status", "200"), ("content-type", "application/grpc")]
OK = [("grpc-status", "0")]


class Pair:
    """Our client connection and h2's server connection, wired back to back."""

    def __init__(self, limits: Limits | None = None, **server_settings: int) -> None:
        self.client = ClientConnection(limits)
        self.server = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False,
                header_encoding="utf-8",
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        codes = {
            "initial_window_size": h2.settings.SettingCodes.INITIAL_WINDOW_SIZE,
            "max_concurrent_streams": h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS,
        }
        self.server.local_settings = h2.settings.Settings(
            client=False, initial_values={codes[k]: v for k, v in server_settings.items()}
        )
        self.server.initiate_connection()
        self.client_events: list[Event] = []
        self.server_events: list[h2.events.Event] = []
        self.pump()

    def pump(self) -> None:
        while True:
            to_server = self.client.data_to_send()
            if to_server:
                self.server_events += self.server.receive_data(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                self.client_events += self.client.receive(to_client)
            if not to_server and not to_client:
                return

    def raw(self, data: bytes) -> list[Event]:
        """Bytes straight to the client (what h2 would refuse to send)."""
        events = self.client.receive(data)
        self.client_events += events
        return events

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.client_events if isinstance(e, kind)]

    def server_of(self, kind: type) -> list[Any]:
        return [e for e in self.server_events if isinstance(e, kind)]

    def answer(self, sid: int, body: bytes = b"\0\0\0\0\x02hi") -> None:
        self.server.send_headers(sid, RESPONSE)
        self.server.send_data(sid, body)
        self.server.send_headers(sid, OK, end_stream=True)
        self.pump()


def test_a_request_and_its_answer_go_through() -> None:
    pair = Pair()
    sid = pair.client.request(REQUEST, b"\0\0\0\0\x05hello")
    pair.pump()
    [received] = pair.server_of(h2.events.RequestReceived)
    assert received.stream_id == sid == 1
    assert dict(received.headers)[":path"] == "/pkg.Service/Method"
    data = pair.server_of(h2.events.DataReceived)
    assert b"".join(d.data for d in data) == b"\0\0\0\0\x05hello"
    assert pair.server_of(h2.events.StreamEnded)  # END_STREAM on the last DATA frame
    pair.answer(sid)
    assert pair.of(ResponseReceived) == [ResponseReceived(sid, RESPONSE, False)]
    assert b"".join(e.data for e in pair.of(DataReceived)) == b"\0\0\0\0\x02hi"
    assert pair.of(TrailersReceived) == [TrailersReceived(sid, OK)]
    assert pair.client.open_streams == 0
    # the next request takes the next odd id
    assert pair.client.request(REQUEST, b"") == 3


def test_a_trailers_only_answer_ends_the_stream() -> None:
    pair = Pair()
    sid = pair.client.request(REQUEST, b"\0\0\0\0\0")
    pair.pump()
    block = [*RESPONSE, ("grpc-status", "5"), ("grpc-message", "no")]
    pair.server.send_headers(sid, block, end_stream=True)
    pair.pump()
    assert pair.of(ResponseReceived) == [ResponseReceived(sid, block, True)]
    assert pair.client.open_streams == 0


def test_a_request_over_the_servers_window_waits_for_it() -> None:
    pair = Pair(initial_window_size=1000)
    body = bytes(range(256)) * 20  # 5120 bytes
    sid = pair.client.request(REQUEST, body)
    pair.pump()
    got = b"".join(d.data for d in pair.server_of(h2.events.DataReceived))
    assert got == body[:1000]
    assert not pair.server_of(h2.events.StreamEnded)
    for _ in range(10):
        pair.server.acknowledge_received_data(1000, sid)
        pair.server.increment_flow_control_window(1000)  # the connection's too
        pair.pump()
    got = b"".join(d.data for d in pair.server_of(h2.events.DataReceived))
    assert got == body
    assert pair.server_of(h2.events.StreamEnded)  # the end went on the last frame
    assert pair.of(StreamWritable) == [StreamWritable(sid)]


def test_the_servers_stream_limit_is_kept() -> None:
    pair = Pair(max_concurrent_streams=2)
    first = pair.client.request(REQUEST, b"")
    pair.client.request(REQUEST, b"")
    assert not pair.client.has_room
    pair.pump()
    pair.answer(first)
    assert pair.client.has_room


def test_goaway_refuses_the_streams_above_its_last_and_lets_the_others_finish() -> None:
    pair = Pair()
    first = pair.client.request(REQUEST, b"")
    second = pair.client.request(REQUEST, b"")
    pair.pump()
    pair.raw(frame(FrameType.GOAWAY, 0, 0, first.to_bytes(4, "big") + bytes(4)))
    assert pair.of(StreamReset) == [StreamReset(second, ErrorCode.REFUSED_STREAM, True)]
    assert not pair.client.accepts_requests and pair.client.closed is None
    pair.answer(first)
    assert pair.of(TrailersReceived) == [TrailersReceived(first, OK)]


def test_goaway_with_an_error_ends_the_connection() -> None:
    pair = Pair()
    sid = pair.client.request(REQUEST, b"")
    pair.pump()
    pair.server.close_connection(error_code=ErrorCode.ENHANCE_YOUR_CALM)
    pair.pump()
    assert pair.of(StreamReset) == [StreamReset(sid, ErrorCode.CANCEL, True)]
    [closed] = pair.of(ConnectionClosed)
    assert closed.code == ErrorCode.ENHANCE_YOUR_CALM and closed.by_peer
    assert "ENHANCE_YOUR_CALM" in closed.reason


def test_a_reset_by_the_server_and_a_cancel_by_the_client() -> None:
    pair = Pair()
    sid = pair.client.request(REQUEST, b"")
    pair.pump()
    pair.server.reset_stream(sid, error_code=ErrorCode.REFUSED_STREAM)
    pair.pump()
    assert pair.of(StreamReset) == [StreamReset(sid, ErrorCode.REFUSED_STREAM, True)]
    other = pair.client.request(REQUEST, b"")
    pair.client.cancel(other)
    pair.pump()
    [reset] = pair.server_of(h2.events.StreamReset)
    assert reset.stream_id == other and reset.error_code == ErrorCode.CANCEL
    # what the server sends on it meanwhile is dropped
    pair.raw(frame(FrameType.HEADERS, 0x4, other, header_block(RESPONSE)))
    assert not pair.of(ResponseReceived) and pair.client.closed is None


def test_a_malformed_answer_resets_its_stream_only() -> None:
    pair = Pair()
    for bad in (
        [("content-type", "application/grpc")],  # no :status
        [(":status", "200"), (":path", "/x")],
        [("content-type", "x"), (":status", "200")],
        [(":status", "200"), ("connection", "close")],
    ):
        sid = pair.client.request(REQUEST, b"")
        pair.raw(frame(FrameType.HEADERS, 0x4, sid, header_block(bad)))
        assert pair.of(StreamReset)[-1] == StreamReset(sid, ErrorCode.PROTOCOL_ERROR, False)
    # trailers without the end of the stream, and a pseudo-header in trailers
    for trailers, flags in ((OK, 0x4), ([(":status", "200")], 0x5)):
        sid = pair.client.request(REQUEST, b"")
        pair.raw(frame(FrameType.HEADERS, 0x4, sid, header_block(RESPONSE)))
        pair.raw(frame(FrameType.HEADERS, flags, sid, header_block(trailers)))
        assert pair.of(StreamReset)[-1] == StreamReset(sid, ErrorCode.PROTOCOL_ERROR, False)
    assert pair.client.closed is None and not pair.of(TrailersReceived)


def test_what_no_server_may_send_ends_the_connection() -> None:
    for bad in (
        frame(FrameType.PUSH_PROMISE, 0x4, 1, bytes(4)),
        frame(FrameType.HEADERS, 0x4, 2, header_block(RESPONSE)),  # a stream of its own
        frame(FrameType.HEADERS, 0x4, 99, header_block(RESPONSE)),  # one never opened
        frame(FrameType.DATA, 0, 99, b"x"),
        frame(FrameType.DATA, 0, 1, bytes(17_000)),  # over the frame size
    ):
        pair = Pair()
        pair.client.request(REQUEST, b"")
        pair.pump()
        pair.raw(bad)
        [closed] = pair.of(ConnectionClosed)
        assert not closed.by_peer and closed.code in (
            ErrorCode.PROTOCOL_ERROR,
            ErrorCode.FRAME_SIZE_ERROR,
        ), (bad[:9], closed)
        assert not pair.client.accepts_requests


def test_a_server_that_floods_pings_is_dropped() -> None:
    pair = Pair(Limits(calm_budget=10))
    pair.raw(b"".join(frame(FrameType.PING, 0, 0, bytes(8)) for _ in range(11)))
    [closed] = pair.of(ConnectionClosed)
    assert closed.code == ErrorCode.ENHANCE_YOUR_CALM


def test_the_client_and_our_server_talk_to_each_other() -> None:
    client, server = ClientConnection(), ServerConnection()
    body = b"\0\0\0\0\x03abc" * 40_000  # over both of the default windows
    sid = client.request(REQUEST, body)
    got = bytearray()
    ended = False
    for _ in range(100):
        for event in server.receive(client.data_to_send()):
            if isinstance(event, RequestReceived):
                assert dict(event.headers)[":path"] == "/pkg.Service/Method"
            if isinstance(event, DataReceived):
                got += event.data
                server.consumed(event.stream_id, len(event.data))
                ended = event.ended
        for event in client.receive(server.data_to_send()):
            assert isinstance(event, StreamWritable)
        if ended:
            break
    assert bytes(got) == body and ended
    server.respond(sid, header_block(RESPONSE))
    server.send_data(sid, b"\0\0\0\0\x01z")
    server.end(sid, header_block(OK))
    events = client.receive(server.data_to_send())
    assert [type(e) for e in events] == [ResponseReceived, DataReceived, TrailersReceived]
    assert client.open_streams == 0 and server.open_streams == 0


def _server_bytes() -> st.SearchStrategy[bytes]:
    kinds = st.sampled_from([int(k) for k in FrameType] + [0x42])
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
def test_no_bytes_a_server_sends_break_the_client(data: st.DataObject) -> None:
    pair = Pair()
    pair.client.request(REQUEST, b"\0\0\0\0\x01x")
    pair.client.request(REQUEST, b"")
    pair.pump()
    garbage = data.draw(_server_bytes())
    cuts = sorted(data.draw(st.lists(st.integers(0, len(garbage)), max_size=4)))
    pieces = [garbage[a:b] for a, b in zip([0, *cuts], [*cuts, len(garbage)], strict=True)]
    for piece in pieces:
        for event in pair.raw(piece):
            assert not isinstance(event, RequestReceived | StreamEnded)
    assert pair.client.open_streams <= 2
    # what the client sends back is whole frames of known types; a connection it
    # ended says so last, with GOAWAY
    out = pair.client.data_to_send()
    kinds = []
    while out:
        n = int.from_bytes(out[:3], "big")
        assert len(out) >= 9 + n and out[3] in set(FrameType)
        kinds.append(out[3])
        out = out[9 + n :]
    closed = pair.of(ConnectionClosed)
    if closed and not closed[0].by_peer:
        assert kinds[-1] == FrameType.GOAWAY
