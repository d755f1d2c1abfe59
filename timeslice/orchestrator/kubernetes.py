"""Discovery from Kubernetes labels (`serve orchestrator --kubernetes`): the thin
I/O shell around `timeslice.orchestrator.discovery`.

Nodes and labelled Pods are each listed (in pages), then watched from the
list's resourceVersion; when a watch ends, or the server answers 410 Gone (the
version is too old, or a list's continue token expired), they are listed again.
Each change marks the labels' view dirty; one reconciler then turns the
difference into the orchestrator's own setting calls (`set_group_nodes`,
`register_job` as `DISCOVERY_REGISTRANT`), once both lists have been read. A lost
API server is retried with backoff; none of it holds up a grant, and a setting
the table refuses is logged and left.

The client is `kubernetes_asyncio` (extra `timeslice[kubernetes]`): its
configuration loaders (in-cluster service account with token refresh, or a
kubeconfig with its TLS and auth plugins) and its API client; responses are
read raw and bounded here (a page, a watch event), since a pod with large
annotations or a huge cluster must not exhaust the orchestrator's memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from timeslice.errors import (
    ConflictError,
    InvalidArgumentError,
    ResourceExhaustedError,
    TimeSliceError,
    UnavailableError,
)
from timeslice.orchestrator import discovery as dsc
from timeslice.orchestrator.state import LockTable
from timeslice.security.principals import DISCOVERY_REGISTRANT

log = logging.getLogger(__name__)


class DiscoveryHost(Protocol):
    """What discovery needs of the orchestrator: its table to read, and the two
    setting methods that an operator's calls use too."""

    @property
    def table(self) -> LockTable: ...

    async def set_group_nodes(self, group: str, nodes: tuple[str, ...]) -> None: ...

    async def register_job(
        self, group: str, job: str, node: str, backend: dict[str, Any] | None, by: str = ""
    ) -> None: ...


@dataclass(frozen=True, kw_only=True)
class DiscoveryLimits:
    """What discovery holds and waits for at most."""

    max_nodes: int = 10_000
    max_pods: int = 100_000
    # One watch event or list page, in bytes (etcd keeps objects to 1.5 MiB).
    max_event_bytes: int = 4 * 1024 * 1024
    max_page_bytes: int = 64 * 1024 * 1024
    page_size: int = 500
    # How long one watch runs before the server ends it (then: list again).
    watch_seconds: int = 300
    # A list call's time limit; a watch's silence beyond watch_seconds plus this.
    request_timeout: float = 30.0
    # Backoff between tries while the API server cannot be reached.
    retry_min: float = 0.2
    retry_max: float = 30.0


class _Gone(Exception):
    """410: the resourceVersion (or continue token) is too old: list again."""


class _Objects:
    """The listed and watched objects of one kind, as discovery reads them."""

    def __init__(
        self,
        name: str,
        selector: str,
        key_of: Callable[[Mapping[str, Any]], str | None],
        read: Callable[[Mapping[str, Any]], Any],
        limit: int,
    ) -> None:
        self.name, self.selector, self.limit = name, selector, limit
        self._key_of, self._read = key_of, read
        self.items: dict[str, Any] = {}
        self.listed = False

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        if len(objects) > self.limit:
            raise ResourceExhaustedError(f"more than {self.limit} {self.name} to follow")
        self.items = {}
        for obj in objects:
            self.put(obj)
        self.listed = True

    def put(self, obj: Mapping[str, Any]) -> None:
        key = self._key_of(obj)
        if key is None:
            return
        try:
            info = self._read(obj)
        except InvalidArgumentError as exc:
            log.warning("kubernetes discovery: ignoring %s %s: %s", self.name, key[:256], exc)
            info = None
        if info is None:
            self.items.pop(key, None)
        elif key in self.items or len(self.items) < self.limit:
            self.items[key] = info
        else:
            log.warning(
                "kubernetes discovery: more than %d %s; ignoring more", self.limit, self.name
            )

    def remove(self, obj: Mapping[str, Any]) -> None:
        key = self._key_of(obj)
        if key is not None:
            self.items.pop(key, None)


class KubernetesDiscovery:
    """Follows the cluster's labelled nodes and pods into `host`'s settings.

    `kubeconfig` None: the in-cluster service account (the orchestrator's pod)."""

    def __init__(
        self,
        host: DiscoveryHost,
        *,
        kubeconfig: str | None = None,
        limits: DiscoveryLimits | None = None,
    ) -> None:
        self.host = host
        self.kubeconfig = kubeconfig
        self.limits = limits or DiscoveryLimits()
        self.nodes = _Objects("nodes", "", _name_of, dsc.node_info, self.limits.max_nodes)
        self.pods = _Objects("pods", dsc.POD_SELECTOR, _uid_of, dsc.pod_info, self.limits.max_pods)
        self.applied = dsc.Desired()
        self.synced = asyncio.Event()  # set after each reconcile that acted on both lists
        self._dirty = asyncio.Event()
        self._api: Any = None
        self._core: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._warned: set[str] = set()

    async def start(self) -> None:
        """Load the client's configuration (a bad or missing one fails here) and
        start following; the API server itself may come later."""
        try:
            from kubernetes_asyncio import client, config  # noqa: PLC0415 (only here)
        except ImportError as exc:
            raise ConflictError(
                f"--kubernetes needs the kubernetes client ({exc}): pip install 'timeslice[kubernetes]'"
            ) from None
        configuration = client.Configuration()
        if self.kubeconfig is not None and not os.path.isfile(self.kubeconfig):
            raise InvalidArgumentError(f"kubeconfig {self.kubeconfig}: no such file")
        try:
            if self.kubeconfig is not None:
                await config.load_kube_config(
                    config_file=self.kubeconfig, client_configuration=configuration
                )
            else:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError, ValueError) as exc:
            where = self.kubeconfig or "the in-cluster service account"
            raise InvalidArgumentError(f"kubernetes configuration from {where}: {exc}") from None
        self._api = client.ApiClient(configuration=configuration)
        self._core = client.CoreV1Api(self._api)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow(self.nodes, self._core.list_node)),
            loop.create_task(self._follow(self.pods, self._core.list_pod_for_all_namespaces)),
            loop.create_task(self._reconcile_forever()),
        ]
        log.info("kubernetes discovery: following nodes and pods at %s", configuration.host)

    async def close(self) -> None:
        """Stop following. Idempotent."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._api is not None:
            await self._api.close()
            self._api = None

    # --- list and watch ---------------------------------------------------------------

    async def _follow(self, objects: _Objects, call: Callable[..., Any]) -> None:
        delay = self.limits.retry_min
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                version = await self._list(objects, call)
                self._dirty.set()
                delay = self.limits.retry_min
                await self._watch(objects, call, version)
            except _Gone:
                log.info(
                    "kubernetes discovery: %s changed too much to follow; listing again",
                    objects.name,
                )
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "kubernetes discovery: %s: %s; retrying in %.1f s",
                    objects.name,
                    _describe(exc),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.limits.retry_max)
                continue
            if loop.time() - began < 1.0:  # a watch that ends at once: do not spin
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.limits.retry_max)

    async def _list(self, objects: _Objects, call: Callable[..., Any]) -> str:
        """List every object (page by page); the list's resourceVersion."""
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            options: dict[str, Any] = {"limit": self.limits.page_size}
            if token:
                options["_continue"] = token
            if objects.selector:
                options["label_selector"] = objects.selector
            response = await call(
                **options, _preload_content=False, _request_timeout=self.limits.request_timeout
            )
            async with response:
                _check_status(response.status, objects.name)
                page = _json(await _read_all(response, self.limits.max_page_bytes))
            metadata = dsc.mapping(page.get("metadata") or {}, "a list's metadata")
            found = page.get("items") or []
            if not isinstance(found, list):
                raise InvalidArgumentError(f"the list of {objects.name} has no items")
            items.extend(found)
            if len(items) > objects.limit:
                raise ResourceExhaustedError(f"more than {objects.limit} {objects.name} to follow")
            token = metadata.get("continue")
            if not token:
                version = metadata.get("resourceVersion")
                if not isinstance(version, str) or not version:
                    raise InvalidArgumentError(f"the list of {objects.name} has no resourceVersion")
                objects.replace(items)
                return version

    async def _watch(self, objects: _Objects, call: Callable[..., Any], version: str) -> None:
        """Follow changes from `version` until the server ends the watch."""
        import aiohttp  # noqa: PLC0415 (kubernetes_asyncio's own transport)

        options: dict[str, Any] = {"label_selector": objects.selector} if objects.selector else {}
        response = await call(
            **options,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.limits.watch_seconds,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(
                sock_connect=self.limits.request_timeout,
                sock_read=self.limits.watch_seconds + self.limits.request_timeout,
            ),
        )
        async with response:
            _check_status(response.status, objects.name)
            async for line in _lines(response, self.limits.max_event_bytes):
                event = _json(line)
                kind, obj = event.get("type"), dsc.mapping(event.get("object"), "a watch event")
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise _Gone()
                    raise UnavailableError(f"the watch of {objects.name} failed ({code})")
                if kind in ("ADDED", "MODIFIED"):
                    objects.put(obj)
                elif kind == "DELETED":
                    objects.remove(obj)
                else:
                    continue  # BOOKMARK, or a type this version does not know
                self._dirty.set()

    # --- from the labels to the settings ----------------------------------------------

    async def _reconcile_forever(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if not (self.nodes.listed and self.pods.listed):
                continue
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kubernetes discovery: reconciling failed; retrying")
                await asyncio.sleep(self.limits.retry_max / 10)
                self._dirty.set()

    async def reconcile(self) -> None:
        """Set what the labels' change since the last reconcile calls for."""
        after = dsc.desired(self.nodes.items.values(), self.pods.items.values())
        table = self.host.table
        discovered = dsc.discovered_pods(table.job_backends, table.registrant, DISCOVERY_REGISTRANT)
        for action in dsc.plan(self.applied, after, dict(table.nodes), discovered):
            try:
                await self._act(action)
            except TimeSliceError as exc:
                log.warning("kubernetes discovery: %s refused: %s", action, exc.message)
        for pod in after.duplicates:
            if pod.uid not in self._warned:
                self._warned.add(pod.uid)
                log.warning(
                    "kubernetes discovery: pod %s is a second pod of job %s on node %s"
                    " (group %s); only the first by name counts",
                    pod.name,
                    pod.job,
                    pod.node,
                    pod.group,
                )
        self.applied = after
        self.synced.set()

    async def _act(self, action: dsc.Action) -> None:
        match action:
            case dsc.SetNodes():
                log.info("kubernetes discovery: group %s spans %s", action.group, action.nodes)
                await self.host.set_group_nodes(action.group, action.nodes)
            case dsc.SetPod():
                backend = dsc.pod_backend(action.pod_uid) if action.pod_uid else None
                log.info(
                    "kubernetes discovery: job %s of group %s on node %s: %s",
                    action.job,
                    action.group,
                    action.node,
                    f"pod {action.pod_uid}" if action.pod_uid else "forgotten",
                )
                await self.host.register_job(
                    action.group, action.job, action.node, backend, by=DISCOVERY_REGISTRANT
                )
            case _:
                raise TypeError(f"not a discovery action: {action!r}")


def _name_of(obj: Mapping[str, Any]) -> str | None:
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj, Mapping) else None
    return name if isinstance(name, str) and name else None


def _uid_of(obj: Mapping[str, Any]) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid") if isinstance(obj, Mapping) else None
    return uid if isinstance(uid, str) and uid else None


def _check_status(status: int, what: str) -> None:
    if status == 410:
        raise _Gone()
    if not 200 <= status <= 299:
        raise UnavailableError(f"the API server answered {status} for {what}")


def _json(data: bytes) -> Mapping[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise InvalidArgumentError("the API server sent something other than JSON") from None
    return dsc.mapping(value, "the API server's answer")


async def _read_all(response: Any, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise ResourceExhaustedError(f"an answer of the API server is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _lines(response: Any, limit: int) -> AsyncIterator[bytes]:
    """The lines of a watch (one event each), none longer than `limit`."""
    pending = bytearray()
    async for chunk in response.content.iter_any():
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end])
            del pending[: end + 1]
            if line.strip():
                yield line
        if len(pending) > limit:
            raise ResourceExhaustedError(f"a watch event is over {limit} bytes")
    if pending.strip():
        yield bytes(pending)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeSliceError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"[:512]
