"""A TCP forwarder the campaign can cut, to put one orchestrator out of PostgreSQL's
reach while its jobs still reach it.

Each orchestrator of a run reaches the database through a proxy of its own on
127.0.0.1. `cut()` is a partition: on the connections already open nothing
passes either way any more (they stay open, so the orchestrator sees its
statements hang, not fail), and a new connection is accepted but never reaches
the database. `heal()` closes the connections the cut stranded (their peers
would have given them up by then) and lets new ones through again.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 64 * 1024


class Proxy:
    """Forwards 127.0.0.1:`port` (known once started) to `host`:`target_port`."""

    def __init__(self, host: str, target_port: int) -> None:
        self.host, self.target_port = host, target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.cuts = 0

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        self._open.clear()
        self.cuts += 1

    def resume(self) -> None:
        """End a cut as a stall ends: what was held back passes now, late, and the
        connections stay open."""
        self._open.set()

    def heal(self) -> None:
        """Close what the cut stranded, and let new connections through."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        self._open.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.heal()  # every connection closed: each one's task ends by itself
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._open.wait()  # a connection made during a cut never gets through
            if writer.transport.is_closing():
                return  # closed by the heal
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
            except OSError:
                return
            self._writers.add(up_writer)
            await asyncio.gather(
                self._pump(reader, up_writer), self._pump(up_reader, writer),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            self._tasks.discard(task)
            writer.transport.abort()
            self._writers.discard(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                # Bytes read during a cut are dropped, as a partition drops them: the
                # connection is closed by `heal` before anything else passes (after
                # `resume` they pass, late).
                await self._open.wait()
                if writer.transport.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()
            self._writers.discard(writer)
