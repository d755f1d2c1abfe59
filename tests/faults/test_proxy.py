"""The campaign's cuttable proxy: bytes pass until a cut, none pass during one (the
connection stays open), and after the heal the stranded connection is closed and
new ones pass again."""

from __future__ import annotations

import asyncio

import pytest

from tests.faults.proxy import Proxy

pytestmark = pytest.mark.timeout(20)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_a_cut_stops_every_byte_and_a_heal_closes_what_it_stranded() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = Proxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"before")
        assert await asyncio.wait_for(reader.readexactly(6), 2) == b"before"

        proxy.cut()
        writer.write(b"during")
        with pytest.raises(TimeoutError):  # no answer, and no error: a partition
            await asyncio.wait_for(reader.read(6), 0.3)
        assert not reader.at_eof()
        late_reader, late_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        late_writer.write(b"late")
        with pytest.raises(TimeoutError):  # accepted, never through
            await asyncio.wait_for(late_reader.read(4), 0.3)

        proxy.heal()
        assert await asyncio.wait_for(reader.read(6), 2) == b""  # closed, "during" dropped
        fresh_reader, fresh_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        fresh_writer.write(b"after")
        assert await asyncio.wait_for(fresh_reader.readexactly(5), 2) == b"after"
        for w in (writer, late_writer, fresh_writer):
            w.close()
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()
