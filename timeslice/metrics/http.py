"""The metrics and probe port: `GET /metrics`, `/healthz` and `/readyz` over plain
HTTP/1.1, served on the event loop.

Kubernetes' gRPC probes cannot speak TLS, and Prometheus scrapes HTTP: this small
endpoint answers both. It is bounded as every other socket is: one request per
connection (answered, then closed), its request line and headers capped at
`max_head_bytes` (431 beyond), the whole exchange within `timeout` seconds (a
client that sends slowly or reads slowly is dropped), at most `max_connections`
at once (one more is closed unanswered), and only GET and HEAD of those three
paths (405 for another method, 404 for another path, 400 for what does not parse).
The HTTP parsing is h11's (a sans-IO HTTP/1.1 implementation), so this module
only moves bytes and picks the answer.

- `/metrics`: the registry's exposition in Prometheus' text format, rendered at
  most once every `min_render_interval` seconds (1 s): a scrape within it gets the
  last rendering, so that no number of scrapers makes the event loop render (some
  milliseconds for a few hundred jobs) more often than that;
- `/healthz`: 200 while the process serves this port;
- `/readyz`: 200 while `ready()` says so (the gRPC health service's SERVING), else 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from http import HTTPStatus

import h11
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

PATHS = ("/metrics", "/healthz", "/readyz")
# The least time between two renderings of the registry, in seconds.
MIN_RENDER_INTERVAL = 1.0
_TEXT = b"text/plain; charset=utf-8"


class MetricsServer:
    """Serves `registry` and the probes on HOST:PORT until stopped."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        *,
        max_connections: int = 32,
        max_head_bytes: int = 8192,
        timeout: float = 5.0,
        min_render_interval: float | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.registry = registry
        self.ready = ready
        self.max_connections = max_connections
        self.max_head_bytes = max_head_bytes
        self.timeout = timeout
        self.min_render_interval = (
            MIN_RENDER_INTERVAL if min_render_interval is None else min_render_interval
        )
        # (when, what) of the last rendering of the registry.
        self._rendered: tuple[float, bytes] | None = None
        #: Renderings of the registry so far (tests read it).
        self.renders = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._address: str | None = None

    @property
    def address(self) -> str:
        """ "HOST:PORT" it listens on (known once started)."""
        if self._address is None:
            raise RuntimeError("the metrics server is not started")
        return self._address

    async def start(self) -> None:
        """Listen (port 0: any free port)."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=self.max_head_bytes
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def stop(self) -> None:
        """Stop listening and drop the connections still open."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or len(self._connections) >= self.max_connections:
            writer.close()  # over the limit: no answer, nothing held
            return
        self._connections.add(task)
        try:
            async with asyncio.timeout(self.timeout):
                await self._exchange(reader, writer)
                await _linger(reader, writer)
        except (TimeoutError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return  # stopped: the connection's task is ours, and ends quietly
        except Exception:
            log.exception("the metrics endpoint failed to answer")
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_head_bytes)
        try:
            request = await _read_request(conn, reader, self.max_head_bytes)
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                status = exc.error_status_hint
                await _send(writer, conn, status, _TEXT, f"{status} bad request\n".encode(), True)
            return
        if request is None:
            return  # the client closed before sending a request
        status, kind, body = self._answer(request)
        # A HEAD answer has the headers of the GET one and no body (h11 sends none).
        await _send(writer, conn, status, kind, body, request.method != b"HEAD")

    def _exposition(self) -> bytes:
        """The registry's text, rendered again only once the last rendering is
        `min_render_interval` old."""
        now = time.monotonic()
        if self._rendered is None or now - self._rendered[0] >= self.min_render_interval:
            self._rendered = (now, generate_latest(self.registry))
            self.renders += 1
        return self._rendered[1]

    def _answer(self, request: h11.Request) -> tuple[int, bytes, bytes]:
        path = request.target.split(b"?", 1)[0].decode("ascii", "replace")
        if path not in PATHS:
            return 404, _TEXT, b"not found: serves /metrics, /healthz, /readyz\n"
        if request.method not in (b"GET", b"HEAD"):
            return 405, _TEXT, b"method not allowed: GET or HEAD\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST.encode(), self._exposition()
        if path == "/healthz":
            return 200, _TEXT, b"ok\n"
        if self.ready():
            return 200, _TEXT, b"ready\n"
        return 503, _TEXT, b"not ready: the service is not SERVING\n"


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After the answer: say no more will come, and read (and drop) what the client
    still sends, up to 64 KiB or a second, so that closing with unread input does
    not reset the connection before the client has read the answer."""
    if writer.can_write_eof():
        writer.write_eof()
    left = 65536
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.0):
            while left > 0 and (data := await reader.read(min(left, 4096))):
                left -= len(data)


async def _read_request(
    conn: h11.Connection, reader: asyncio.StreamReader, limit: int
) -> h11.Request | None:
    received = 0
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            return event
        if event is h11.NEED_DATA:
            # h11 caps a head that is still incomplete; a whole one that came in
            # one read is capped here.
            data = await reader.read(4096)
            received += len(data)
            if received > limit:
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            conn.receive_data(data)
        elif isinstance(event, h11.ConnectionClosed):
            return None
        else:  # nothing else comes before a request
            raise h11.RemoteProtocolError("expected a request", error_status_hint=400)


async def _send(
    writer: asyncio.StreamWriter,
    conn: h11.Connection,
    status: int,
    kind: bytes,
    body: bytes,
    with_body: bool,
) -> None:
    headers = [
        (b"content-type", kind),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"cache-control", b"no-store"),
    ]
    if status == 405:
        headers.append((b"allow", b"GET, HEAD"))
    reason = HTTPStatus(status).phrase.encode()
    data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
    if with_body:
        data = (data or b"") + (conn.send(h11.Data(data=body)) or b"")
    data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
    writer.write(data)
    await writer.drain()
