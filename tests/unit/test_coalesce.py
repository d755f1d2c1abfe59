"""`Coalesced`: the writes of one turn of the event loop leave in one write, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from timeslice.api.coalesce import FLUSH_BYTES, Coalesced


class Recording(asyncio.Transport):
    """A transport that keeps what is written to it, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_writes_of_one_turn_leave_as_one_write_in_order() -> None:
    inner = Recording()
    outer = Coalesced(inner)
    outer.write(b"HEADERS")
    outer.write(b"")
    outer.write(bytearray(b"DATA"))
    outer.write(memoryview(b"TRAILERS"))
    assert inner.writes == []  # nothing before the turn ends
    await turn()
    assert inner.writes == [b"HEADERSDATATRAILERS"]
    outer.write(b"next")
    await turn()
    assert inner.writes == [b"HEADERSDATATRAILERS", b"next"]


async def test_a_write_past_the_limit_leaves_at_once_with_those_before_it() -> None:
    inner = Recording()
    outer = Coalesced(inner)
    big = b"x" * FLUSH_BYTES
    outer.write(b"a")
    outer.write(big)
    assert inner.writes == [b"a" + big]
    assert outer.get_write_buffer_size() == 0
    await turn()
    assert inner.writes == [b"a" + big]


async def test_close_sends_what_is_kept_and_abort_drops_it() -> None:
    inner = Recording()
    outer = Coalesced(inner)
    outer.write(b"GOAWAY")
    outer.close()
    assert inner.writes == [b"GOAWAY"] and inner.closed
    await turn()
    assert inner.writes == [b"GOAWAY"]

    inner = Recording()
    outer = Coalesced(inner)
    outer.write(b"lost")
    assert outer.get_write_buffer_size() == 4
    outer.abort()
    await turn()
    assert inner.writes == [] and inner.aborted and outer.is_closing()


async def test_what_it_does_not_keep_is_the_transport_s() -> None:
    inner = Recording()
    outer = Coalesced(inner)
    assert outer.get_extra_info("peername") == ("127.0.0.1", 1)
    assert outer.get_extra_info("socket", "none") == "none"
