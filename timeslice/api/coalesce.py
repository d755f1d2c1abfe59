"""One socket write for what a connection sends in one turn of the event loop.

grpclib hands each HTTP/2 frame group to its transport as soon as it is made: a
unary response leaves as HEADERS, DATA and trailers in three writes, with a
WINDOW_UPDATE for the request in a fourth, and asyncio's transport sends each
at once, one system call apiece, each one able to wake the peer. `Coalesced`
stands between grpclib and the transport: writes made in the same turn of the
loop are kept, and the next turn sends them in one write. What the connection
sends is unchanged, byte for byte and in order; only the number of writes
falls. A write that would keep more than `FLUSH_BYTES` waiting is sent at once
with those before it, so large messages are not held back or copied twice.

Both ends use it: the servers' connections (`LimitedProtocol`) and the clients'
channels (`timeslice.client._transport.open_channel`).
"""

from __future__ import annotations

import asyncio
from typing import Any

# Writes kept for the next turn of the loop add up to at most this many bytes.
FLUSH_BYTES = 64 * 1024


class Coalesced(asyncio.Transport):
    """`transport`, with the writes of one turn of the event loop sent as one."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size > FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_scheduled)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Send what is kept now."""
        pending, self._pending, self._size = self._pending, [], 0
        if pending:
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def _flush_scheduled(self) -> None:
        self._scheduled = False
        if not self._transport.is_closing():
            self.flush()
        else:
            self._pending, self._size = [], 0

    def close(self) -> None:
        if not self._transport.is_closing():
            self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending, self._size = [], 0
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()
