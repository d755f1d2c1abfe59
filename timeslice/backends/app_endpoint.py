"""The `app_endpoint` backend: inference servers that free their own accelerator
memory when asked over HTTP.

A job is one or more replicas of one server, all switched together:

    config  {"app": "vllm" | "sglang", "endpoints": ["http://host:port", ...]}
    params  {"mode": "offload" | "discard" | "", "tags": ["weights", "kv_cache", ...]}

vLLM (a server started with `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`):

    snapshot  POST /sleep?level=1 (offload), ?level=2 (discard), no level (its default, 1);
              with tags, POST /sleep?tags=...: vLLM drops the memory it sleeps by tag,
              so offload may not name "weights"; a vLLM too old to know tags ignores
              them and sleeps at its default level, which keeps the weights
    restore   POST /wake_up, or /wake_up?tags=... to wake some regions only
    state     GET /is_sleeping -> {"is_sleeping": bool}

SGLang (a server started with `--enable-memory-saver`):

    snapshot  POST /release_memory_occupation {"tags": [...]} ({} = every region)
    restore   POST /resume_memory_occupation {"tags": [...]}
    state     none: SGLang has no query for it

Whether SGLang keeps its weights in host memory is a launch flag
(`--enable-weights-cpu-backup`), not a request parameter, so before it releases
anything the backend reads each server's `GET /get_server_info`: a server without
the memory saver would answer success and free nothing, and offload of weights
from one without the backup would lose them. Both are refused.

Only servers on this node's loopback are called, unless the agent allows more
(`--app-endpoint-allow PREFIX`, `BackendContext.allowed_urls`; see
`timeslice.backends.endpoints`): any other endpoint is refused before a
connection is made. An error quotes at most 80 characters of a server's answer.

Neither application reports how many bytes it moved, so `Moved` is empty; the
backend sees no accelerators. Every request has a timeout, from the agent option
`app_endpoint.timeout_s` (default 60 s: a large model takes a while to copy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import httpx

from timeslice.backends import (
    DISCARD,
    OFFLOAD,
    AcceleratorMemory,
    BackendContext,
    JobRef,
    Moved,
    parse_mode,
)
from timeslice.backends.endpoints import check_allowed, normalize_endpoint, normalize_prefixes
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    TimeSliceError,
    UnavailableError,
)

VLLM: Final = "vllm"
SGLANG: Final = "sglang"
APPS: Final = (VLLM, SGLANG)

TIMEOUT_OPTION: Final = "app_endpoint.timeout_s"
DEFAULT_TIMEOUT_S: Final = 60.0

WEIGHTS: Final = "weights"
_VLLM_LEVELS: Final = {OFFLOAD: "1", DISCARD: "2"}
_CONFIG_KEYS: Final = frozenset({"app", "endpoints"})
# What an error may quote of a server's answer: the agent must not relay its bodies.
_EXCERPT_CHARS: Final = 80

T = TypeVar("T")


# --- what a job and an operation ask for ----------------------------------------------


@dataclass(frozen=True)
class Target:
    """The servers of one job: which application, and where its replicas listen."""

    app: str
    endpoints: tuple[str, ...]


@dataclass(frozen=True)
class Request:
    """One HTTP request, the same for every replica."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: Mapping[str, Any] | None = None

    def __str__(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.query)
        return f"{self.method} {self.path}" + (f"?{query}" if query else "")


@dataclass(frozen=True)
class Params:
    """One operation's own parameters."""

    mode: str = ""
    tags: tuple[str, ...] = ()

    @property
    def releases_weights(self) -> bool:
        """Whether the weights are among the regions released (no tags: all of them)."""
        return not self.tags or WEIGHTS in self.tags


def parse_target(config: Mapping[str, Any]) -> Target:
    """A job's config, checked: a known app and at least one distinct endpoint."""
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise InvalidArgumentError(
            f"app_endpoint config has unknown keys {sorted(unknown)}; expected app, endpoints"
            " (mode and tags belong to each operation)"
        )
    app = config.get("app")
    if app not in APPS:
        raise InvalidArgumentError(f"unknown app {app!r}; expected one of {', '.join(APPS)}")
    raw = config.get("endpoints")
    if not isinstance(raw, (list, tuple)) or not raw:
        raise InvalidArgumentError("app_endpoint config needs a non-empty list of endpoints")
    endpoints = tuple(normalize_endpoint(url) for url in raw)
    if len(set(endpoints)) != len(endpoints):
        raise InvalidArgumentError(f"endpoints repeat: {list(endpoints)}")
    return Target(str(app), endpoints)


def parse_params(params: Mapping[str, Any]) -> Params:
    """An operation's mode and tags, checked."""
    mode = params.get("mode") or ""
    if not isinstance(mode, str):
        raise InvalidArgumentError(f"mode must be a string, not {mode!r}")
    if mode:
        parse_mode(mode)
    tags = params.get("tags") or ()
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) and t for t in tags):
        raise InvalidArgumentError(f"tags must be a list of non-empty strings, not {tags!r}")
    if len(set(tags)) != len(tags):
        raise InvalidArgumentError(f"tags repeat: {list(tags)}")
    return Params(mode, tuple(tags))


# --- the requests each application takes -------------------------------------------------


def release_request(app: str, params: Params) -> Request:
    """The request that frees a server's accelerator memory."""
    if app == VLLM:
        if params.tags:
            if params.mode == OFFLOAD and params.releases_weights:
                raise InvalidArgumentError(
                    "vLLM drops the regions it sleeps by tag: offload cannot name"
                    " 'weights' (use mode discard, or no tags to offload everything)"
                )
            return Request("POST", "/sleep", tuple(("tags", t) for t in params.tags))
        level = _VLLM_LEVELS.get(params.mode)
        return Request("POST", "/sleep", (("level", level),) if level else ())
    return Request("POST", "/release_memory_occupation", body=_tags_body(params.tags))


def resume_request(app: str, tags: Sequence[str]) -> Request:
    """The request that brings a server's memory back (`tags`: some regions only)."""
    if app == VLLM:
        return Request("POST", "/wake_up", tuple(("tags", t) for t in tags))
    return Request("POST", "/resume_memory_occupation", body=_tags_body(tags))


def _tags_body(tags: Sequence[str]) -> dict[str, Any]:
    # SGLang parses the body into its request type and refuses a missing one.
    return {"tags": list(tags)} if tags else {}


def keeps_weights(app: str, params: Params) -> bool:
    """Whether a server that released for `params` can resume with its weights intact.

    True for SGLang offload only once its weight backup was confirmed (see
    `AppEndpointBackend.snapshot`)."""
    if not params.releases_weights:
        return True
    if app == VLLM:
        return params.mode == OFFLOAD or (params.mode == "" and not params.tags)
    return params.mode == OFFLOAD


# --- failures, per endpoint ----------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """What went wrong with one endpoint."""

    endpoint: str
    detail: str
    error: type[TimeSliceError] = field(default=InternalError)

    def __str__(self) -> str:
        return f"{self.endpoint}: {self.detail}"


def _raise_for(failures: Sequence[Failure], summary: str) -> None:
    if failures:
        details = "; ".join(str(f) for f in failures)
        raise failures[0].error(f"{summary}: {details}")


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[: _EXCERPT_CHARS - 3] + "..."


# --- the backend -----------------------------------------------------------------------


class AppEndpointBackend:
    """Switches vLLM and SGLang servers through their HTTP sleep APIs."""

    name = "app_endpoint"

    def __init__(self, context: BackendContext) -> None:
        self._timeout = _timeout_option(context.options)
        self._allowed = normalize_prefixes(context.allowed_urls)
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    async def check(self, job: JobRef) -> tuple[str, ...]:
        """Refuse a config this backend cannot act on (or may not call); return the
        resources it claims."""
        endpoints = parse_target(job.config).endpoints
        check_allowed(endpoints, self._allowed)
        return tuple(f"endpoint:{url}" for url in endpoints)

    async def check_operation(self, job: JobRef, kind: str, params: Mapping[str, Any]) -> None:
        """Refuse a mode or tags the application cannot apply, before anything is sent."""
        wanted = parse_params(params)
        if kind == "snapshot":
            release_request(parse_target(job.config).app, wanted)

    async def snapshot(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        """Have every replica free its accelerator memory, all at once."""
        target, wanted = parse_target(job.config), parse_params(params)
        request = release_request(target.app, wanted)
        if target.app == SGLANG:
            await self._check_sglang_can_release(target, wanted)
        outcomes = await self._on_each(target.endpoints, request)
        failures = [o for o in outcomes if isinstance(o, Failure)]
        if failures:
            released = [ep for ep, o in zip(target.endpoints, outcomes) if o is None]
            undone = await self._undo_release(target.app, wanted, released)
            _raise_for(
                failures,
                f"{request} failed on {len(failures)} of {len(outcomes)} endpoints{undone}",
            )
        return Moved()

    async def restore(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        """Have every replica take its accelerator memory back, all at once."""
        target, wanted = parse_target(job.config), parse_params(params)
        request = resume_request(target.app, wanted.tags)
        outcomes = await self._on_each(target.endpoints, request)
        failures = [o for o in outcomes if isinstance(o, Failure)]
        _raise_for(failures, f"{request} failed on {len(failures)} of {len(outcomes)} endpoints")
        return Moved()

    async def state(self, job: JobRef) -> str | None:
        """vLLM: SAVED if every replica sleeps, RUNNING if none does; else unknown."""
        target = parse_target(job.config)
        if target.app != VLLM:
            return None
        outcomes = await self._on_each(target.endpoints, Request("GET", "/is_sleeping"), _sleeping)
        if any(isinstance(o, Failure) for o in outcomes):
            return None
        if all(o is True for o in outcomes):
            return "SAVED"
        if all(o is False for o in outcomes):
            return "RUNNING"
        return None

    async def accelerators(self) -> list[AcceleratorMemory]:
        """None: these servers report no device memory over their APIs."""
        return []

    async def close(self) -> None:
        """Close the HTTP client; later calls are refused."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # --- helpers ----------------------------------------------------------------------

    async def _check_sglang_can_release(self, target: Target, wanted: Params) -> None:
        outcomes = await self._on_each(
            target.endpoints, Request("GET", "/get_server_info"), _json_object
        )
        _raise_for(
            [o for o in outcomes if isinstance(o, Failure)],
            "cannot read the SGLang server settings",
        )
        refusals: list[Failure] = []
        for endpoint, info in zip(target.endpoints, outcomes):
            assert isinstance(info, dict)
            if info.get("enable_memory_saver") is False:
                refusals.append(
                    Failure(
                        endpoint,
                        "started without --enable-memory-saver, it would release nothing",
                        ConflictError,
                    )
                )
            elif wanted.mode == OFFLOAD and wanted.releases_weights:
                if info.get("enable_weights_cpu_backup") is not True:
                    refusals.append(
                        Failure(
                            endpoint,
                            "keeps no host copy of its weights (no --enable-weights-cpu-backup):"
                            " offload would lose them; use mode discard",
                            ConflictError,
                        )
                    )
        _raise_for(refusals, "refused before releasing anything")

    async def _undo_release(self, app: str, wanted: Params, released: list[str]) -> str:
        """Resume the replicas that did release (best effort); say what became of them."""
        if not released:
            return ""
        names = ", ".join(released)
        if not keeps_weights(app, wanted):
            return (
                f"; left released: {names} (their weights were dropped, and a resumed"
                " server would run on lost weights)"
            )
        outcomes = await self._on_each(released, resume_request(app, wanted.tags))
        failures = [o for o in outcomes if isinstance(o, Failure)]
        if not failures:
            return f"; resumed again: {names}"
        return f"; resuming them again failed too: {'; '.join(str(f) for f in failures)}"

    async def _on_each(
        self,
        endpoints: Sequence[str],
        request: Request,
        read: Callable[[httpx.Response], T] | None = None,
    ) -> list[T | None | Failure]:
        """Send `request` to every endpoint concurrently; each answer read by `read`."""
        check_allowed(endpoints, self._allowed)  # also for jobs known from before
        client = self._http()

        async def one(endpoint: str) -> T | None | Failure:
            return await self._send(client, endpoint, request, read)

        calls: list[Awaitable[T | None | Failure]] = [one(ep) for ep in endpoints]
        return list(await asyncio.gather(*calls))

    async def _send(
        self,
        client: httpx.AsyncClient,
        endpoint: str,
        request: Request,
        read: Callable[[httpx.Response], T] | None,
    ) -> T | None | Failure:
        try:
            response = await client.request(
                request.method,
                endpoint + request.path,
                params=list(request.query),
                json=request.body,
            )
        except httpx.TimeoutException:
            return Failure(
                endpoint, f"{request}: no answer within {self._timeout:g} s", DeadlineExceededError
            )
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            return Failure(endpoint, f"{request}: cannot reach it ({reason})", UnavailableError)
        if not response.is_success:
            return Failure(
                endpoint,
                f"{request} -> HTTP {response.status_code}: {_excerpt(response.text)}"
                + _hint(request, response.status_code),
                ConflictError if response.status_code < 500 else InternalError,
            )
        if read is None:
            return None
        try:
            return read(response)
        except ValueError as exc:
            return Failure(endpoint, f"{request}: unexpected answer ({exc})")

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise UnavailableError("the app_endpoint backend is closed")
        if self._client is None:
            # The servers are reached directly: proxy settings are for other traffic.
            self._client = httpx.AsyncClient(timeout=self._timeout, trust_env=False)
        return self._client


def _timeout_option(options: Mapping[str, str]) -> float:
    raw = options.get(TIMEOUT_OPTION)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        timeout = float(raw)
    except ValueError:
        timeout = -1.0
    if not 0 < timeout < float("inf"):
        raise InvalidArgumentError(f"{TIMEOUT_OPTION} must be a positive number of seconds")
    return timeout


def _hint(request: Request, status: int) -> str:
    if status == 404 and request.path in ("/sleep", "/wake_up", "/is_sleeping"):
        return " (is it a vLLM server started with VLLM_SERVER_DEV_MODE=1 --enable-sleep-mode?)"
    return ""


def _json_object(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {_excerpt(response.text)}")
    return body


def _sleeping(response: httpx.Response) -> bool:
    flag = _json_object(response).get("is_sleeping")
    if not isinstance(flag, bool):
        raise ValueError(f"no is_sleeping flag in {_excerpt(response.text)}")
    return flag
