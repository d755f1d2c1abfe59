"""What the client tests share: fake servers on 127.0.0.1, and a proxy that can
cut every connection as a crash or a network fault would."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from grpclib.server import Server


def listening_socket(port: int = 0) -> socket.socket:
    sock = socket.create_server(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def free_address() -> str:
    with listening_socket() as sock:
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def start_server(services: list[Any], port: int = 0) -> tuple[Server, str]:
    """A grpclib server of `services` on 127.0.0.1 (`port` 0: any free one)."""
    server = Server(services)
    sock = listening_socket(port)
    await server.start(sock=sock)
    return server, f"127.0.0.1:{sock.getsockname()[1]}"


async def stop_server(server: Server) -> None:
    server.close()
    await asyncio.wait_for(server.wait_closed(), 5)


class Proxy:
    """Forwards TCP to `upstream`; `cut()` drops every connection."""

    def __init__(self, upstream: str) -> None:
        self.upstream_port = int(upstream.rsplit(":", 1)[1])
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._forward, sock=listening_socket())
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        self.server.close()
        await self.server.wait_closed()
