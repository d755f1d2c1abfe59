"""A small Kubernetes API server for the tests: Nodes and Pods, served as the real
one serves them (an asyncio HTTP/1.1 server of our own, no framework).

- `GET /api/v1/nodes`, `GET /api/v1/pods`: a `NodeList`/`PodList` with
  `metadata.resourceVersion`, in pages (`limit`, `continue`), filtered by a
  `labelSelector` of label keys (`a,b`: both present);
- `?watch=1&resourceVersion=RV`: a chunked stream of `{"type": "ADDED|MODIFIED|
  DELETED", "object": {...}}` lines, one per change after RV, where an object
  that stops matching the selector is DELETED and one that starts is ADDED (as
  the real watch cache does); a version older than the oldest kept (`compact`)
  gets `{"type": "ERROR", "object": {"kind": "Status", "code": 410}}`, and
  `expire_watches` sends that to every open watch.

The test changes objects with `put_node`, `label_pod`, `delete_pod`..., and can
`stop` the server (every connection dropped) and `start` it again on its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "fake-kube-token"


class FakeKubernetes:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}}
        self.version = 100
        self.oldest = 0  # watches from an older version get 410
        # (version, kind, key, old object or None, new object or None)
        self.history: list[tuple[int, str, str, Any, Any]] = []
        self.port = 0
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None
        self._watches: set[asyncio.Queue[tuple[str, Any] | None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._changed = asyncio.Condition()

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Go away: stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await self._server.wait_closed()
            self._server = None
        await asyncio.sleep(0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "tester", "user": {"token": TOKEN}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                "current-context": "fake",
            }
        )

    # --- what the test changes -------------------------------------------------------------

    def put_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        old = self.objects["nodes"].get(name)
        obj = copy.deepcopy(old) if old else {"kind": "Node", "apiVersion": "v1",
                                              "metadata": {"name": name, "uid": f"uid-{name}"}}  # fmt: skip
        obj["metadata"]["labels"] = dict(labels or {})
        self._change("nodes", name, obj)

    def put_pod(
        self, name: str, uid: str, node: str, labels: dict[str, str], phase: str = "Running"
    ) -> None:
        obj = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "rl", "uid": uid, "labels": dict(labels)},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer"}]},
            "status": {"phase": phase},
        }
        self._change("pods", uid, obj)

    def label_pod(self, uid: str, labels: dict[str, str]) -> None:
        obj = copy.deepcopy(self.objects["pods"][uid])
        obj["metadata"]["labels"] = dict(labels)
        self._change("pods", uid, obj)

    def delete_pod(self, uid: str) -> None:
        self._change("pods", uid, None)

    def compact(self) -> None:
        """Forget the history: a watch from any version so far gets 410 Gone."""
        self.oldest = self.version + 1
        self.history.clear()

    def expire_watches(self) -> None:
        """Send 410 Gone to every open watch (its version is too old)."""
        self.compact()
        for queue in self._watches:
            queue.put_nowait(("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}))

    def _change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        self.version += 1
        old = self.objects[kind].get(key)
        if obj is None:
            self.objects[kind].pop(key, None)
            obj_new = None
        else:
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.objects[kind][key] = obj
            obj_new = copy.deepcopy(obj)
        self.history.append((self.version, kind, key, copy.deepcopy(old), obj_new))
        for queue in self._watches:
            queue.put_nowait(("CHANGE", self.history[-1]))

    # --- HTTP ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                request = await reader.readline()
                if not request:
                    return
                headers = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                method, target, _ = request.decode().split(" ", 2)
                self.requests.append(target)
                if headers.get("authorization") != f"Bearer {TOKEN}":
                    await self._send(writer, 401, {"kind": "Status", "code": 401})
                    continue
                url = urlsplit(target)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                kind = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods"}.get(url.path)
                if method != "GET" or kind is None:
                    await self._send(writer, 404, {"kind": "Status", "code": 404})
                elif query.get("watch") in ("1", "true", "True"):
                    await self._watch(writer, kind, query)
                    return
                else:
                    await self._list(writer, kind, query)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    async def _list(self, writer: asyncio.StreamWriter, kind: str, query: dict[str, str]) -> None:
        keys = _selector(query.get("labelSelector", ""))
        items = [o for _, o in sorted(self.objects[kind].items()) if _matches(o, keys)]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items)
        page = items[start : start + limit]
        more = start + limit < len(items)
        metadata = {"resourceVersion": str(self.version)}
        if more:
            metadata["continue"] = str(start + limit)
        list_kind = "NodeList" if kind == "nodes" else "PodList"
        await self._send(
            writer,
            200,
            {"kind": list_kind, "apiVersion": "v1", "metadata": metadata, "items": page},
        )

    async def _watch(self, writer: asyncio.StreamWriter, kind: str, query: dict[str, str]) -> None:
        keys = _selector(query.get("labelSelector", ""))
        since = int(query.get("resourceVersion") or 0)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()
        self._watches.add(queue)
        try:
            if since < self.oldest:
                await _chunk(writer, {"type": "ERROR", "object": {"kind": "Status", "code": 410}})
            else:
                for entry in self.history:
                    if entry[0] > since:
                        queue.put_nowait(("CHANGE", entry))
                timeout = float(query.get("timeoutSeconds") or 3600)
                loop = asyncio.get_running_loop()
                ends = loop.time() + timeout
                while (left := ends - loop.time()) > 0:
                    try:
                        item = await asyncio.wait_for(queue.get(), left)
                    except TimeoutError:
                        break
                    if item is None:
                        break
                    what, entry = item
                    if what == "ERROR":
                        await _chunk(writer, {"type": "ERROR", "object": entry})
                        break
                    _, changed_kind, _, old, new = entry
                    if changed_kind != kind:
                        continue
                    event = _event(old, new, keys)
                    if event is not None:
                        await _chunk(writer, event)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            self._watches.discard(queue)


def _selector(text: str) -> list[str]:
    return [key for key in text.split(",") if key]


def _matches(obj: dict[str, Any] | None, keys: list[str]) -> bool:
    labels = (obj or {}).get("metadata", {}).get("labels") or {}
    return obj is not None and all(key in labels for key in keys)


def _event(old: Any, new: Any, keys: list[str]) -> dict[str, Any] | None:
    was, now = _matches(old, keys), _matches(new, keys)
    if now:
        return {"type": "MODIFIED" if was else "ADDED", "object": new}
    if was:
        return {"type": "DELETED", "object": new if new is not None else old}
    return None


async def _chunk(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    data = json.dumps(event).encode() + b"\n"
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()
