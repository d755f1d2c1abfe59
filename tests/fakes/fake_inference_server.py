"""A stand-in for the memory APIs of vLLM and SGLang servers, on 127.0.0.1.

It answers as the real servers do, with no model behind it:

    vllm    POST /sleep?level=1|2, POST /sleep?tags=..., POST /wake_up[?tags=...],
            GET /is_sleeping -> {"is_sleeping": bool}; every one 404 unless dev_mode
    sglang  GET|POST /release_memory_occupation and /resume_memory_occupation with a
            JSON body {"tags": [...]} (no body: 400; success: 200 `null`);
            GET /get_server_info -> its launch settings

It keeps which memory regions are released, and whether the weights survived, so
that a test can check what a server would really hold. Every request is recorded;
`fail` and `delay` make one path answer with an error, or late.

    async with FakeInferenceServer("vllm") as server:
        ... server.url ... server.sleeping ... server.calls("/sleep")
"""

from __future__ import annotations

import asyncio
import json
from contextlib import suppress
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

REGIONS = {"vllm": ("weights", "kv_cache"), "sglang": ("weights", "kv_cache", "cuda_graph")}
_NO_BODY = object()


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    body: Any = None  # the parsed JSON body; None when there was none


@dataclass
class _Answer:
    status: int
    body: Any = _NO_BODY  # JSON-ready; _NO_BODY: an empty body


class FakeInferenceServer:
    """An in-process HTTP/1.1 server that plays one vLLM or SGLang replica."""

    def __init__(
        self,
        app: str,
        *,
        dev_mode: bool = True,
        memory_saver: bool = True,
        weights_cpu_backup: bool = True,
    ) -> None:
        if app not in REGIONS:
            raise ValueError(f"unknown app {app!r}")
        self.app = app
        self.dev_mode = dev_mode  # vLLM serves its sleep API only in dev mode
        self.memory_saver = memory_saver  # SGLang frees nothing without it
        self.weights_cpu_backup = weights_cpu_backup  # SGLang keeps weights on release
        self.released: set[str] = set()
        self.weights_intact = True
        self.requests: list[Recorded] = []
        self.fail: dict[str, tuple[int, str]] = {}  # path -> (status, body text)
        self.delay: dict[str, float] = {}  # path -> seconds before it answers
        self._server: asyncio.Server | None = None
        # Connections end by themselves once `close` shuts their sockets: cancelling
        # a stream handler makes asyncio log an error.
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._closing = asyncio.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sleeping(self) -> bool:
        """Whether any region is released (what vLLM's /is_sleeping reports)."""
        return bool(self.released)

    def calls(self, path: str) -> list[Recorded]:
        """The requests received for `path`."""
        return [r for r in self.requests if r.path == path]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        self._closing.set()
        for writer in self._connections.values():
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> FakeInferenceServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- HTTP ------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            while not self._closing.is_set() and (request := await _read_request(reader)):
                recorded, keep_alive = request
                answer = await self._answer(recorded)
                if self._closing.is_set():
                    break
                writer.write(_encode(answer, keep_alive))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            del self._connections[task]
            writer.close()

    async def _answer(self, request: Recorded) -> _Answer:
        self.requests.append(request)
        if delay := self.delay.get(request.path):
            with suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay)
        if failure := self.fail.get(request.path):
            return _Answer(failure[0], {"error": {"message": failure[1]}})
        if self.app == "vllm":
            return self._vllm(request)
        return self._sglang(request)

    # --- the applications --------------------------------------------------------------

    def _vllm(self, request: Recorded) -> _Answer:
        if not self.dev_mode:
            return _Answer(404, {"detail": "Not Found"})
        if (request.method, request.path) not in _VLLM_ROUTES:
            return _not_found(request, _VLLM_ROUTES)
        if request.path == "/is_sleeping":
            return _Answer(200, {"is_sleeping": self.sleeping})
        tags = request.query.get("tags", [])
        if unknown := set(tags) - set(REGIONS["vllm"]):
            return _Answer(500, {"detail": f"unknown tags {sorted(unknown)}"})
        if request.path == "/wake_up":
            self.released -= set(tags) if tags else set(self.released)
            return _Answer(200)
        if tags:  # sleeping by tag discards what it sleeps
            self._release(set(tags), keep_weights=False)
            return _Answer(200)
        level = request.query.get("level", ["1"])[0]
        if level not in ("1", "2"):
            return _Answer(500, {"detail": f"bad level {level}"})
        self._release(set(REGIONS["vllm"]), keep_weights=level == "1")
        return _Answer(200)

    def _sglang(self, request: Recorded) -> _Answer:
        if request.path == "/get_server_info" and request.method == "GET":
            return _Answer(
                200,
                {
                    "enable_memory_saver": self.memory_saver,
                    "enable_weights_cpu_backup": self.weights_cpu_backup,
                    "version": "fake",
                },
            )
        if request.path not in _SGLANG_MEMORY or request.method not in ("GET", "POST"):
            return _not_found(request, {("POST", path) for path in _SGLANG_MEMORY})
        if not isinstance(request.body, dict):
            return _Answer(400, {"message": "the request needs a JSON object body"})
        tags = request.body.get("tags") or list(REGIONS["sglang"])
        if unknown := set(tags) - set(REGIONS["sglang"]):
            return _Answer(400, {"error": {"message": f"unknown tags {sorted(unknown)}"}})
        if not self.memory_saver:
            return _Answer(200, None)  # it answers success and frees nothing
        if request.path == "/release_memory_occupation":
            self._release(set(tags), keep_weights=self.weights_cpu_backup)
        else:
            self.released -= set(tags)
        return _Answer(200, None)

    def _release(self, regions: set[str], *, keep_weights: bool) -> None:
        if "weights" in regions - self.released and not keep_weights:
            self.weights_intact = False
        self.released |= regions


_VLLM_ROUTES = {("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")}
_SGLANG_MEMORY = ("/release_memory_occupation", "/resume_memory_occupation")


def _not_found(request: Recorded, routes: set[tuple[str, str]]) -> _Answer:
    if any(path == request.path for _, path in routes):
        return _Answer(405, {"detail": "Method Not Allowed"})
    return _Answer(404, {"detail": "Not Found"})


async def _read_request(reader: asyncio.StreamReader) -> tuple[Recorded, bool] | None:
    """The next request on a connection, and whether the client keeps it open."""
    line = await reader.readline()
    if not line:
        return None
    method, target, version = line.decode("latin-1").split()
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raw = await reader.readexactly(int(headers.get("content-length", "0")))
    body: Any = None
    if raw:
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    return Recorded(method, parts.path, query, body), keep_alive


def _encode(answer: _Answer, keep_alive: bool) -> bytes:
    body = b"" if answer.body is _NO_BODY else json.dumps(answer.body).encode()
    head = [
        f"HTTP/1.1 {answer.status} {HTTPStatus(answer.status).phrase}",
        f"content-length: {len(body)}",
        f"connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    if body:
        head.append("content-type: application/json")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
