"""The clients of the node agent: start snapshots and restores, and wait for them.

`AsyncSnapshotAgentClient` is the asyncio client; `SnapshotAgentClient` is the
blocking one, with the v1alpha1 client's signatures, driving an async client
on an event loop of its own.

A Snapshot, Restore or ResetJob changes the job on the agent, so it is sent
once: the client connects first and retries only while no connection can be
opened (nothing has been sent then); a connection lost during the call raises
`UnavailableError`, since the agent may have acted on it. GetOperation, Status
and the health check are retried while the agent cannot be reached.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import TypeVar

import betterproto2
from grpclib.client import Channel

from timeslice.api import hot
from timeslice.api.connections import check_http2
from timeslice.api.h2client import H2Channel
from timeslice.api.gen.grpc.health import v1 as health_pb
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client._bridge import LoopThread
from timeslice.client._transport import (
    call_prepared,
    call_with_retry,
    close_channel,
    credentials,
    map_errors,
    open_channel,
    open_unary,
)
from timeslice.client.agent_types import (
    OPERATION_COMPLETE,
    OPERATION_FAILED,
    BackendLike,
    GetOperationResponse,
    HealthResponse,
    ResetJobResponse,
    RestoreResponse,
    SnapshotResponse,
    StatusResponse,
    check_job_id,
    enum_name,
    get_operation_response,
    health_response,
    operation_request,
    status_response,
)
from timeslice.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    TimeSliceError,
)
from timeslice.ids import parse_target
from timeslice.security.tls import ClientTls

R = TypeVar("R")
M = TypeVar("M", bound=betterproto2.Message)

DEFAULT_ENDPOINT = "127.0.0.1:9001"

# The longest one GetOperation asks the agent to wait; a longer wait asks again.
_WAIT_SLICE_SEC = 30.0
# How much longer than the agent's own wait the client waits for its answer.
# More than a second: grpclib sends a deadline over 10 s in whole seconds, cut down.
_WAIT_BACKSTOP_SEC = 2.0
_SERVICE = "/snapshot_agent.v1alpha1.SnapshotAgentService"
_SNAPSHOT, _RESTORE, _GET_OPERATION, _STATUS, _RESET_JOB, _SWITCH_GROUP = (
    f"{_SERVICE}/{method}"
    for method in ("Snapshot", "Restore", "GetOperation", "Status", "ResetJob", "SwitchGroup")
)
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# A PENDING answer sooner than this (and than half the wait asked for) comes from
# an agent that does not wait (a v1alpha1 one): the client then polls instead.
_EARLY_ANSWER_SEC = 0.5

# The name the v1alpha1 client raises, so that code written for it keeps catching it;
# like its errors, ours carry `code` (equal to grpcio's `StatusCode`) and `details`.
SnapshotAgentError = TimeSliceError


class OperationFailedError(TimeSliceError):
    """A snapshot or restore ran on the agent and failed.

    ``response`` is the operation's final state (its ``error`` says why).
    """

    def __init__(
        self,
        message: str = "",
        *,
        operation_id: str = "",
        response: GetOperationResponse | None = None,
    ) -> None:
        super().__init__(message)
        self.operation_id = operation_id
        self.response = response


@dataclass(frozen=True)
class _Stubs:
    """The ways to the agent: grpclib's channel (a channel given, and streams), and
    the `H2Channel` its unary calls take (None: they go through grpclib's)."""

    channel: Channel
    agent: pb.SnapshotAgentServiceStub
    unary: H2Channel | None = None

    def call(
        self, route: str, request: betterproto2.Message, reply: type[M], timeout: float | None
    ) -> Awaitable[M]:
        """A unary call; through grpclib's client, in a task of its own (`call_prepared`),
        so its callers need no task of their own for it."""
        return call_prepared(self.unary or self.agent, route, bytes(request), reply, timeout)


class AsyncSnapshotAgentClient:
    """Asyncio client of a node's snapshot agent.

    ``endpoint`` is ``"host:port"``, ``"[ipv6]:port"`` or ``"unix:/path"``;
    ``channel`` replaces the connection to it (and is not closed by the
    client). ``tls`` (a `ClientTls`) connects over TLS and ``token`` sends
    ``authorization: Bearer <token>`` with every call; each defaults to the
    environment's (TIMESLICE_TLS_*, TIMESLICE_TOKEN) unless
    ``credentials_from_env`` is False. ``call_timeout_sec`` bounds each call;
    ``reconnect_timeout_sec`` is how long a call keeps trying while the agent
    cannot be reached. ``http2`` is the HTTP/2 client its unary calls take:
    ``"h2core"`` (timeslice's own, `timeslice.api.h2client`: a call leaves in one
    write) or ``"grpclib"``; streams take grpclib's, and so does everything on a
    ``channel`` given.

    The client belongs to the event loop it is first used on.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        channel: Channel | None = None,
        call_timeout_sec: float = 10.0,
        reconnect_timeout_sec: float = 30.0,
        tls: ClientTls | None = None,
        token: str | None = None,
        credentials_from_env: bool = True,
        http2: str = "h2core",
    ) -> None:
        self._target = parse_target(endpoint)
        check_http2(http2)
        self._http2 = http2
        self._tls, self._token = credentials(tls, token, credentials_from_env)
        if not call_timeout_sec > 0:
            raise InvalidArgumentError(f"call_timeout_sec must be positive: {call_timeout_sec}")
        if not reconnect_timeout_sec >= 0:
            raise InvalidArgumentError(
                f"reconnect_timeout_sec must not be negative: {reconnect_timeout_sec}"
            )
        self.endpoint = endpoint
        self._call_timeout_sec = call_timeout_sec
        self._reconnect_timeout_sec = reconnect_timeout_sec
        self._owns_channel = channel is None
        self._stubs = None if channel is None else _stubs(channel)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncSnapshotAgentClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection (not a channel given to the client). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_channel and self._stubs is not None:
            close_channel(self._stubs.channel)
            if self._stubs.unary is not None:
                self._stubs.unary.close()

    async def snapshot(
        self,
        job_id: str,
        group: str = "",
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> SnapshotResponse:
        """Starts moving the job's accelerator context to host storage.

        The positional arguments are the v1alpha1 client's. ``group`` may be
        empty: the agent then finds the job by its id alone. ``backend_config``
        chooses the backend (see `cuda_config`, `app_channel_config`,
        `named_backend`); without it the agent uses the one the job is known by.
        ``backend`` is the deprecated enum (``"cuda"``), ignored when
        ``backend_config`` is given. ``fencing_token``: the caller's
        grant for the group (an older one is refused with `LeaseLostError`).
        ``timeout_sec``: the operation's own deadline on the agent.
        """
        request = operation_request(
            pb.SnapshotRequest, job_id, group, backend, backend_config, fencing_token, timeout_sec
        )
        stubs = self._connect()
        response = await self._send_once(
            f"Snapshot({group}/{job_id})",
            lambda timeout: stubs.call(_SNAPSHOT, request, pb.SnapshotResponse, timeout),
        )
        return SnapshotResponse(operation_id=response.operation_id)

    async def restore(
        self,
        job_id: str,
        group: str = "",
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> RestoreResponse:
        """Starts moving the job's saved context back onto the accelerators.

        The arguments are those of `snapshot()`.
        """
        request = operation_request(
            pb.RestoreRequest, job_id, group, backend, backend_config, fencing_token, timeout_sec
        )
        stubs = self._connect()
        response = await self._send_once(
            f"Restore({group}/{job_id})",
            lambda timeout: stubs.call(_RESTORE, request, pb.RestoreResponse, timeout),
        )
        return RestoreResponse(operation_id=response.operation_id)

    async def get_operation(
        self, operation_id: str, *, timeout_sec: float | None = None
    ) -> GetOperationResponse:
        """The operation's status now; `NotFoundError` for an unknown id."""
        _check_timeout(timeout_sec)
        return await self._ask(operation_id, 0.0, timeout_sec)

    async def status(self, *, timeout_sec: float | None = None) -> StatusResponse:
        """Every job on the node, and every accelerator's memory."""
        stubs = self._connect()
        response = await self._read(
            "Status",
            timeout_sec,
            lambda timeout: stubs.call(_STATUS, pb.StatusRequest(), pb.StatusResponse, timeout),
        )
        return status_response(response)

    async def check_health(
        self, service: str = "", *, timeout_sec: float | None = None
    ) -> HealthResponse:
        """The standard gRPC health check: of the agent, or of one ``service``."""
        stubs = self._connect()
        request = health_pb.HealthCheckRequest(service=service)
        response = await self._read(
            f"Health.Check({service})",
            timeout_sec,
            lambda timeout: stubs.call(
                _HEALTH_CHECK, request, health_pb.HealthCheckResponse, timeout
            ),
        )
        return health_response(response)

    async def reset_job(
        self, job_id: str, group: str = "", *, orchestrator_epoch: int = 0
    ) -> ResetJobResponse:
        """Clears a FAULTED job's fault; the agent then asks its backend where its context
        is. ``orchestrator_epoch``: the orchestrator's call, of that epoch (0: an operator's)."""
        request = pb.ResetJobRequest(
            job_id=check_job_id(job_id), group=group, orchestrator_epoch=orchestrator_epoch
        )
        stubs = self._connect()
        response = await self._send_once(
            f"ResetJob({group}/{job_id})",
            lambda timeout: stubs.call(_RESET_JOB, request, pb.ResetJobResponse, timeout),
        )
        return ResetJobResponse(
            state=enum_name(response.state), table_version=response.table_version
        )

    async def switch_group(
        self,
        group: str,
        next_job_id: str,
        fencing_token: int,
        *,
        jobs: Sequence[pb.SwitchJob | bytes] = (),
        timeout_sec: float,
        token_proof: bytes = b"",
        orchestrator_epoch: int = 0,
    ) -> pb.SwitchGroupResponse:
        """The node's part of a switch of ``group`` to ``next_job_id`` (the
        orchestrator's call): every other live context of the group snapshotted,
        then the next job's restored if saved. Safe to repeat, so it is retried
        while the agent cannot be reached, within ``timeout_sec``. ``jobs``: each a
        ``SwitchJob``, or its encoding (``bytes(job)``, kept by a caller that sends
        the same ones again). ``token_proof``: the orchestrator's proof that the
        token and ``orchestrator_epoch`` (its epoch; 0: not an orchestrator's
        call) are its own (`timeslice.fencing`)."""
        _check_timeout(timeout_sec)
        stubs = self._connect()
        # Encoded once for every try (`timeslice.api.hot`: it is on every switch's path).
        framed = b"".join(
            hot.switch_job(job if isinstance(job, bytes) else bytes(job)) for job in jobs
        )

        async def send(left: float) -> pb.SwitchGroupResponse:
            request = hot.switch_group_request(
                group=group,
                next_job_id=next_job_id,
                fencing_token=fencing_token,
                timeout_ms=max(1, round(left * 1000)),
                jobs=framed,
                token_proof=token_proof,
                orchestrator_epoch=orchestrator_epoch,
            )
            # The agent answers by its deadline; the call's own outlasts it a little.
            return await call_prepared(
                stubs.unary or stubs.agent,
                _SWITCH_GROUP,
                request,
                pb.SwitchGroupResponse,
                timeout=left + _WAIT_BACKSTOP_SEC,
            )

        return await self._read(f"SwitchGroup({group} -> {next_job_id})", timeout_sec, send)

    async def wait_for_operation(
        self,
        operation_id: str,
        poll_interval_sec: float = 1.0,
        *,
        timeout_sec: float | None = None,
    ) -> GetOperationResponse:
        """Waits until the operation is COMPLETE or FAILED, and returns its final state.

        The agent holds each GetOperation open until the operation ends (up to
        30 s, then the client asks again). ``poll_interval_sec`` is the pause
        between asks only for an agent that answers at once (a v1alpha1 one).
        ``timeout_sec``: the longest wait, after which `DeadlineExceededError`
        is raised (the operation goes on).
        """
        _check_timeout(timeout_sec)
        if not poll_interval_sec >= 0:
            raise InvalidArgumentError(
                f"poll_interval_sec must not be negative: {poll_interval_sec}"
            )
        loop = asyncio.get_running_loop()
        deadline = None if timeout_sec is None else loop.time() + timeout_sec
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            wait = _WAIT_SLICE_SEC if left is None else min(_WAIT_SLICE_SEC, left)
            asked_at = loop.time()
            response = await self._ask(operation_id, wait, left)
            if response.finished:
                return response
            now = loop.time()
            if deadline is not None and now >= deadline:
                raise DeadlineExceededError(
                    f"operation {operation_id} still {response.status} after {timeout_sec} s"
                )
            if now - asked_at < min(wait / 2, _EARLY_ANSWER_SEC):
                pause = poll_interval_sec if deadline is None else deadline - now
                await asyncio.sleep(min(poll_interval_sec, pause))

    async def snapshot_and_wait(
        self,
        job_id: str,
        group: str = "",
        poll_interval_sec: float = 1.0,
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> GetOperationResponse:
        """Snapshots the job and waits until its context is in host storage.

        Returns the COMPLETE operation; raises `OperationFailedError` when it
        FAILED, `DeadlineExceededError` after ``timeout_sec``, which is also
        the operation's deadline on the agent (so it does not go on unwatched).
        """
        return await self._run_and_wait(
            "snapshot",
            job_id,
            timeout_sec,
            poll_interval_sec,
            lambda: self.snapshot(
                job_id,
                group,
                backend_config,
                backend=backend,
                fencing_token=fencing_token,
                timeout_sec=timeout_sec,
            ),
        )

    async def restore_and_wait(
        self,
        job_id: str,
        group: str = "",
        poll_interval_sec: float = 1.0,
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> GetOperationResponse:
        """Restores the job and waits until its context is back; as `snapshot_and_wait()`."""
        return await self._run_and_wait(
            "restore",
            job_id,
            timeout_sec,
            poll_interval_sec,
            lambda: self.restore(
                job_id,
                group,
                backend_config,
                backend=backend,
                fencing_token=fencing_token,
                timeout_sec=timeout_sec,
            ),
        )

    async def _run_and_wait(
        self,
        kind: str,
        job_id: str,
        timeout_sec: float | None,
        poll_interval_sec: float,
        start: Callable[[], Awaitable[SnapshotResponse | RestoreResponse]],
    ) -> GetOperationResponse:
        loop = asyncio.get_running_loop()
        started_at = loop.time()
        operation_id = (await start()).operation_id
        left = None if timeout_sec is None else max(0.0, timeout_sec - (loop.time() - started_at))
        try:
            response = await self.wait_for_operation(
                operation_id, poll_interval_sec, timeout_sec=left
            )
        except DeadlineExceededError as error:
            raise DeadlineExceededError(
                f"the {kind} of job {job_id} (operation {operation_id})"
                f" did not finish within {timeout_sec} s"
            ) from error
        if response.status == OPERATION_COMPLETE:
            return response
        reason = response.error or "no reason given"
        if response.status != OPERATION_FAILED:
            reason = f"it ended {response.status}"
        raise OperationFailedError(
            f"the {kind} of job {job_id} (operation {operation_id}) failed: {reason}",
            operation_id=operation_id,
            response=response,
        )

    def _connect(self) -> _Stubs:
        if self._closed:
            raise RuntimeError("the agent client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("the agent client belongs to another event loop; make one per loop")
        if self._stubs is None:
            target = self._target
            unary = open_unary(target, self._tls, self._token) if self._http2 == "h2core" else None
            self._stubs = _stubs(open_channel(target, self._tls, self._token), unary)
        return self._stubs

    async def _read(
        self, what: str, timeout_sec: float | None, send: Callable[[float], Awaitable[R]]
    ) -> R:
        """Sends a call that is safe to repeat, retrying while the agent is unreachable.

        Each try gets what is left of ``timeout_sec``, or ``call_timeout_sec``.
        """
        _check_timeout(timeout_sec)

        def attempt(left: float | None) -> Awaitable[R]:
            return send(self._call_timeout_sec if left is None else left)

        return await call_with_retry(
            attempt,
            what=what,
            budget_sec=timeout_sec,
            reconnect_timeout_sec=self._reconnect_timeout_sec,
            own_task=False,  # every call here is `call_prepared`'s (`_Stubs.call`)
        )

    async def _send_once(self, what: str, send: Callable[[float], Awaitable[R]]) -> R:
        """Sends a call that must not be repeated once the agent may have received it."""
        stubs = self._connect()

        async def open_connection(left: float | None) -> None:
            # Connecting apart from the call tells "the agent could not be
            # reached" (nothing sent: safe to try again) from "the connection
            # broke during the call" (the agent may have acted on it).
            # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancellation
            # that arrives as the connection attempt ends.
            async with asyncio.timeout(self._call_timeout_sec):
                if stubs.unary is not None:
                    await stubs.unary.connect()
                else:
                    await stubs.channel.__connect__()

        await call_with_retry(
            open_connection,
            what=what,
            budget_sec=None,
            reconnect_timeout_sec=self._reconnect_timeout_sec,
        )
        with map_errors(what):
            return await send(self._call_timeout_sec)  # `call_prepared`'s: see `_Stubs.call`

    async def _ask(
        self, operation_id: str, wait_sec: float, budget_sec: float | None
    ) -> GetOperationResponse:
        """One GetOperation that the agent may hold for up to ``wait_sec``."""
        stubs = self._connect()

        def attempt(left: float | None) -> Awaitable[pb.GetOperationResponse]:
            wait = wait_sec if left is None else min(wait_sec, max(0.0, left))
            wait_ms = round(wait * 1000)
            request = pb.GetOperationRequest(operation_id=operation_id, wait_ms=wait_ms or None)
            if wait_ms:
                timeout = wait + _WAIT_BACKSTOP_SEC
            elif left is None:
                timeout = self._call_timeout_sec
            else:
                timeout = max(left, _WAIT_BACKSTOP_SEC)
            return stubs.call(_GET_OPERATION, request, pb.GetOperationResponse, timeout)

        response = await call_with_retry(
            attempt,
            what=f"GetOperation({operation_id})",
            budget_sec=budget_sec,
            reconnect_timeout_sec=self._reconnect_timeout_sec,
            own_task=False,  # `call_prepared`'s: see `_Stubs.call`
        )
        return get_operation_response(response)


class SnapshotAgentClient:
    """Blocking client of a node's snapshot agent, with the v1alpha1 client's calls.

    ``endpoint`` as for `AsyncSnapshotAgentClient` (None: the default,
    127.0.0.1:9001). ``channel`` is kept in the signature for compatibility but
    refused: a grpclib channel belongs to the event loop it was made on, and
    this client runs its own. The keyword-only options are those of
    `AsyncSnapshotAgentClient`; it raises the same exceptions. Usable from any
    thread but that of its own loop; `close()` (or leaving a ``with`` block)
    stops it.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        channel: object = None,
        *,
        call_timeout_sec: float = 10.0,
        reconnect_timeout_sec: float = 30.0,
        tls: ClientTls | None = None,
        token: str | None = None,
        credentials_from_env: bool = True,
    ) -> None:
        if channel is not None:
            raise InvalidArgumentError(
                "SnapshotAgentClient makes its own connection: pass endpoint='host:port'"
                " (or use AsyncSnapshotAgentClient(channel=...) on the channel's event loop)"
            )
        target = endpoint or DEFAULT_ENDPOINT
        parse_target(target)  # a bad endpoint fails here, before a thread starts
        tls, token = credentials(tls, token, credentials_from_env)  # and bad credentials
        self._runner = LoopThread("timeslice-agent-client")

        async def create() -> AsyncSnapshotAgentClient:
            return AsyncSnapshotAgentClient(
                target,
                call_timeout_sec=call_timeout_sec,
                reconnect_timeout_sec=reconnect_timeout_sec,
                tls=tls,
                token=token,
                credentials_from_env=False,
            )

        try:
            self._client = self._runner.run(create)
        except BaseException:
            self._runner.stop()
            self._runner.join()
            raise
        self._join_timeout_sec = call_timeout_sec
        self._finalizer = weakref.finalize(self, self._runner.stop, self._client.close)

    @property
    def endpoint(self) -> str:
        """The agent's address."""
        return self._client.endpoint

    def __enter__(self) -> SnapshotAgentClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection and stops the client's thread. Idempotent."""
        if not self._finalizer.alive:
            return
        self._finalizer()
        self._runner.join(self._join_timeout_sec)

    def snapshot(
        self,
        job_id: str,
        group: str = "",
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> SnapshotResponse:
        """Starts a snapshot of the job; see `AsyncSnapshotAgentClient.snapshot`."""
        call = partial(self._client.snapshot, job_id, group, backend_config, backend=backend)
        return self._run(partial(call, fencing_token=fencing_token, timeout_sec=timeout_sec))

    def restore(
        self,
        job_id: str,
        group: str = "",
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> RestoreResponse:
        """Starts a restore of the job; see `AsyncSnapshotAgentClient.restore`."""
        call = partial(self._client.restore, job_id, group, backend_config, backend=backend)
        return self._run(partial(call, fencing_token=fencing_token, timeout_sec=timeout_sec))

    def get_operation(
        self, operation_id: str, *, timeout_sec: float | None = None
    ) -> GetOperationResponse:
        """The operation's status now."""
        return self._run(lambda: self._client.get_operation(operation_id, timeout_sec=timeout_sec))

    def status(self, *, timeout_sec: float | None = None) -> StatusResponse:
        """Every job on the node, and every accelerator's memory."""
        return self._run(lambda: self._client.status(timeout_sec=timeout_sec))

    def check_health(
        self, service: str = "", *, timeout_sec: float | None = None
    ) -> HealthResponse:
        """The standard gRPC health check: of the agent, or of one ``service``."""
        return self._run(lambda: self._client.check_health(service, timeout_sec=timeout_sec))

    def reset_job(self, job_id: str, group: str = "") -> ResetJobResponse:
        """Clears a FAULTED job's fault."""
        return self._run(lambda: self._client.reset_job(job_id, group))

    def wait_for_operation(
        self,
        operation_id: str,
        poll_interval_sec: float = 1.0,
        *,
        timeout_sec: float | None = None,
    ) -> GetOperationResponse:
        """Waits until the operation is COMPLETE or FAILED; see the async client."""
        return self._run(
            lambda: self._client.wait_for_operation(
                operation_id, poll_interval_sec, timeout_sec=timeout_sec
            )
        )

    def snapshot_and_wait(
        self,
        job_id: str,
        group: str = "",
        poll_interval_sec: float = 1.0,
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> GetOperationResponse:
        """Snapshots the job and waits until it finishes; like the v1alpha1 client, a
        FAILED operation is returned (`.status`, `.error`), not raised."""
        call = partial(
            self._client.snapshot_and_wait,
            job_id,
            group,
            poll_interval_sec,
            backend_config,
            backend=backend,
        )
        return self._finished(partial(call, fencing_token=fencing_token, timeout_sec=timeout_sec))

    def restore_and_wait(
        self,
        job_id: str,
        group: str = "",
        poll_interval_sec: float = 1.0,
        backend_config: pb.BackendConfig | None = None,
        *,
        backend: BackendLike = 0,
        fencing_token: int = 0,
        timeout_sec: float | None = None,
    ) -> GetOperationResponse:
        """Restores the job and waits until it finishes; like the v1alpha1 client, a
        FAILED operation is returned, not raised."""
        call = partial(
            self._client.restore_and_wait,
            job_id,
            group,
            poll_interval_sec,
            backend_config,
            backend=backend,
        )
        return self._finished(partial(call, fencing_token=fencing_token, timeout_sec=timeout_sec))

    def _finished(
        self, factory: Callable[[], Awaitable[GetOperationResponse]]
    ) -> GetOperationResponse:
        try:
            return self._run(factory)
        except OperationFailedError as failed:
            if failed.response is None:
                raise
            return failed.response

    def _run(self, factory: Callable[[], Awaitable[R]]) -> R:
        if not self._finalizer.alive:
            raise RuntimeError("the agent client is closed")
        return self._runner.run(factory)


def _stubs(channel: Channel, unary: H2Channel | None = None) -> _Stubs:
    return _Stubs(channel, pb.SnapshotAgentServiceStub(channel), unary)


def _check_timeout(timeout_sec: float | None) -> None:
    if timeout_sec is not None and not timeout_sec >= 0:
        raise InvalidArgumentError(f"timeout_sec must not be negative: {timeout_sec}")
