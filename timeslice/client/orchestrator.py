"""The asyncio client of the orchestrator.

Every Acquire and Yield carries a request id that stays the same when the call
is retried, so the server answers a retry as it answered the first try: a
client that lost its connection while queued gets its place back, and a
repeated release is not applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from types import TracebackType
from typing import TypeVar

from grpclib.client import Channel

from timeslice.api import hot
from timeslice.api.connections import check_http2
from timeslice.api.h2client import H2Channel
from timeslice.api.gen.snapshot_agent.v1alpha1 import BackendConfig
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client._bridge import AcquireCall, OnAccelerators
from timeslice.client._leases import Holding, LeaseKeeper, LeaseLostCallback
from timeslice.client._connector import (
    DEFAULT_PING_EVERY_SEC,
    DEFAULT_PING_TIMEOUT_SEC,
    Connector,
    Pings,
    answered,
    unreachable,
)
from timeslice.client._transport import (
    backoff_cap,
    backoff_delays,
    call_prepared,
    call_with_retry,
    credentials,
    in_own_task,
    map_errors,
    own_tasks,
)
from timeslice.client.types import (
    AcquireResult,
    AgentList,
    ForceReleaseResult,
    Leadership,
    LeaseInfo,
    OrchestratorGroupStatus,
    WatchEvent,
    YieldResult,
    acquire_result,
    agent_list,
    force_release_result,
    leadership,
    lease_info,
    orchestrator_group_status,
    watch_event,
    yield_result,
)
from timeslice.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    NotHolderError,
    PermissionDeniedError,
    TimeSliceError,
    UnavailableError,
    UnimplementedError,
)
from timeslice.targets import format_target, parse_targets
from timeslice.security.tls import ClientTls

R = TypeVar("R")
Stub = pb.TimeSliceOrchestratorServiceStub

logger = logging.getLogger("timeslice.client")

DEFAULT_TARGET = "127.0.0.1:50051"

# How much longer than the server's own wait limit the client waits for an
# Acquire answer before it gives up on its own: a tenth of the wait, at least
# 0.2 s and at most 1 s. The server's answer at its limit is the one that counts
# (a grant the client gave up on would be held by nobody until its lease ran
# out), and a server that knows no wait limit (a v1alpha1 one) still sees the
# caller leave at about the time it asked for.
_ACQUIRE_BACKSTOP_SHARE = 0.1
_ACQUIRE_BACKSTOP_MIN_SEC = 0.2
_ACQUIRE_BACKSTOP_MAX_SEC = 1.0
# A cycle's calls: their requests are encoded by hand and their answers read in one
# pass (`timeslice.api.hot`, `call_prepared`), where the generated stubs would take
# several times as long.
_SERVICE = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService"
_ACQUIRE, _YIELD, _KEEP_ALIVE = f"{_SERVICE}/Acquire", f"{_SERVICE}/Yield", f"{_SERVICE}/KeepAlive"


def _acquire_deadline(wait_sec: float) -> float:
    """The deadline of an Acquire call whose server gives up after ``wait_sec``."""
    backstop = wait_sec * _ACQUIRE_BACKSTOP_SHARE
    return wait_sec + min(_ACQUIRE_BACKSTOP_MAX_SEC, max(_ACQUIRE_BACKSTOP_MIN_SEC, backstop))


class AsyncTimeSliceOrchestratorClient:
    """Asyncio client of the orchestrator: acquire and release a group's lock.

    ``job_id`` and ``group_id`` given here are used by every call that does not
    name its own. With ``lease_ttl_sec`` set, each grant comes with a lease
    that the client renews in the background until the release; None asks for
    no lease (the holder is then never revoked for silence).
    ``call_timeout_sec`` bounds each call but a waiting Acquire;
    ``reconnect_timeout_sec`` is how long a call keeps retrying while the
    server cannot be reached. ``target`` may list several orchestrators
    (``"h1:50051,h2:50051"``, at most 16) and a host name may resolve to several
    addresses: every one is a candidate, and a call that finds one unreachable or
    a standby is retried on the next (on the active, when a standby names one of
    the candidates), within ``reconnect_timeout_sec``. While a call is open the
    connection is pinged every ``ping_every_sec`` (None: never) and given up on
    after ``ping_timeout_sec`` without an answer, so that a server that stops
    answering (frozen, cut off) is left within their sum. ``tls`` (a `ClientTls`) connects over TLS and
    ``token`` sends ``authorization: Bearer <token>`` with every call; each
    defaults to the environment's (TIMESLICE_TLS_CA, TIMESLICE_TLS_CERT,
    TIMESLICE_TLS_KEY; TIMESLICE_TOKEN) unless ``credentials_from_env`` is
    False. ``channel`` replaces the connection to ``target`` (and is not closed
    by the client; its credentials are the channel's own). ``on_lease_lost(group_id,
    job_id, error)`` is called, on the client's event loop, when a held lease
    is lost; it may be a coroutine function. ``priority`` goes with every
    Acquire: higher is served first in groups under the priority policy.
    ``http2`` is the HTTP/2 client of Acquire, Yield and KeepAlive: ``"h2core"``
    (timeslice's own, `timeslice.api.h2client`, with the same pings) or
    ``"grpclib"``; every other call and stream takes grpclib's.

    The client belongs to the event loop it is made or first used on. `close()` stops
    the renewals and the connection; it does not release held locks.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        job_id: str | None = None,
        group_id: str | None = None,
        *,
        lease_ttl_sec: float | None = 10.0,
        call_timeout_sec: float = 10.0,
        reconnect_timeout_sec: float = 30.0,
        channel: Channel | None = None,
        on_lease_lost: LeaseLostCallback | None = None,
        priority: int = 0,
        tls: ClientTls | None = None,
        token: str | None = None,
        credentials_from_env: bool = True,
        ping_every_sec: float | None = DEFAULT_PING_EVERY_SEC,
        ping_timeout_sec: float = DEFAULT_PING_TIMEOUT_SEC,
        http2: str = "h2core",
    ) -> None:
        targets = parse_targets(target)
        check_http2(http2)
        self._tls, self._token = credentials(tls, token, credentials_from_env)
        pings = (
            None
            if ping_every_sec is None
            else Pings(every=ping_every_sec, timeout=ping_timeout_sec)
        )
        if ping_every_sec is None:
            Pings(timeout=ping_timeout_sec)  # checks it all the same
        if lease_ttl_sec is not None and not lease_ttl_sec > 0:
            raise InvalidArgumentError(f"lease_ttl_sec must be positive or None: {lease_ttl_sec}")
        if not call_timeout_sec > 0:
            raise InvalidArgumentError(f"call_timeout_sec must be positive: {call_timeout_sec}")
        if not reconnect_timeout_sec >= 0:
            raise InvalidArgumentError(
                f"reconnect_timeout_sec must not be negative: {reconnect_timeout_sec}"
            )
        self.target = target
        self.job_id = job_id
        self.group_id = group_id
        self._lease_ttl_ms = None if lease_ttl_sec is None else max(1, round(lease_ttl_sec * 1000))
        self._priority = priority
        self._call_timeout_sec = call_timeout_sec
        self._reconnect_timeout_sec = reconnect_timeout_sec
        self._max_backoff_sec = backoff_cap(len(targets))
        # A channel given is used as it is; otherwise the connector moves along the targets.
        self._connector = (
            Connector(targets, self._tls, self._token, pings, http2) if channel is None else None
        )
        self._fixed = None if channel is None else Stub(channel)
        self._stubs: tuple[Channel, Stub] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        self._leases = LeaseKeeper(
            self._send_keep_alive,
            call_timeout_sec=call_timeout_sec,
            on_lease_lost=on_lease_lost,
        )
        self._closed = False

    async def __aenter__(self) -> AsyncTimeSliceOrchestratorClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stops lease renewals and closes the connection. Held locks stay held."""
        if self._closed:
            return
        self._closed = True
        await self._leases.close()
        if self._connector is not None:
            self._connector.close()

    def acquire(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> AcquireCall:
        """Waits until the job holds the group's lock and its context is loaded.

        ``timeout_sec``: the longest wait (None: no limit), after which
        `DeadlineExceededError` is raised and the job has left the queue.
        Use as ``result = await client.acquire()`` or
        ``async with client.acquire() as result:``.

        Raises `InvalidArgumentError` at once when no job or group is known.
        """
        _check_timeout(timeout_sec)
        job, group = self._job(job_id), self._group(group_id)
        return AcquireCall(
            job,
            group,
            acquire=lambda: self._acquire(job, group, timeout_sec),
            release=lambda error: self._release_after(job, group, error),
        )

    def acquire_groups(
        self,
        group_ids: Sequence[str],
        job_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> AcquireCall:
        """Waits until the job holds every one of ``group_ids``, granted all at once
        (a job that needs its sampler and its trainer pool): none is held while
        another is waited for, so jobs asking in any order cannot deadlock.

        The result is the first group's, with every group's grant in ``grants``.
        ``async with`` releases them all at the end; otherwise `release()` each.
        """
        _check_timeout(timeout_sec)
        job = self._job(job_id)
        groups = list(dict.fromkeys(group_ids))
        if not groups:
            raise InvalidArgumentError("group_ids must name at least one group")
        first, *more = groups

        async def release_all(error: BaseException | None) -> None:
            for group in reversed(groups):
                await self._release_after(job, group, error)

        return AcquireCall(
            job,
            first,
            acquire=lambda: self._acquire(job, first, timeout_sec, more),
            release=release_all,
        )

    async def release(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> YieldResult:
        """Releases the lock (the Yield call) and stops renewing its lease.

        Raises `LeaseLostError` when the grant was revoked in the meantime:
        the lock is then no longer this job's to release.
        """
        return await self._release(self._job(job_id), self._group(group_id), timeout_sec)

    async def get_status(
        self,
        group_id: str | None = None,
        timeout_sec: float | None = None,
        *,
        lock_only: bool = False,
    ) -> OrchestratorGroupStatus:
        """The group's lock state and its jobs' context states on every node
        (``lock_only``: the lock state alone, without asking the agents)."""
        group = self._group(group_id)
        self._connect()
        request = pb.GetGroupStatusRequest(group_id=group, lock_only=lock_only)
        response = await self._retrying(
            f"GetGroupStatus({group})",
            timeout_sec,
            lambda stub, timeout: stub.get_group_status(request, timeout=timeout),
        )
        return orchestrator_group_status(response, group)

    async def list_groups(self, timeout_sec: float | None = None) -> list[str]:
        """Every group the orchestrator knows."""
        self._connect()
        response = await self._retrying(
            "ListGroups",
            timeout_sec,
            lambda stub, timeout: stub.list_groups(pb.ListGroupsRequest(), timeout=timeout),
        )
        return list(response.group_ids)

    async def list_agents(self, timeout_sec: float | None = None) -> AgentList:
        """Every agent the orchestrator knows, each asked for its Status just now, and
        the orchestrator's version."""
        self._connect()
        response = await self._retrying(
            "ListAgents",
            timeout_sec,
            lambda stub, timeout: stub.list_agents(pb.ListAgentsRequest(), timeout=timeout),
        )
        return agent_list(response)

    async def get_leadership(self, timeout_sec: float | None = None) -> Leadership:
        """Where this orchestrator stands: active or standby, the leader lease's epoch
        and what it has left (a standby answers too)."""
        self._connect()
        response = await self._retrying(
            "GetLeadership",
            timeout_sec,
            lambda stub, timeout: stub.get_leadership(pb.GetLeadershipRequest(), timeout=timeout),
        )
        return leadership(response)

    async def each_leadership(
        self, timeout_sec: float = 2.0
    ) -> list[tuple[str, Leadership | TimeSliceError]]:
        """Every address of this client's target, asked where it stands (or why it
        did not say), at once and with this client's credentials: which of the
        candidates is active."""

        async def ask(address: str) -> Leadership | TimeSliceError:
            one = AsyncTimeSliceOrchestratorClient(
                address, lease_ttl_sec=None, call_timeout_sec=timeout_sec,
                reconnect_timeout_sec=0.0, tls=self._tls, token=self._token,
                credentials_from_env=False,
            )  # fmt: skip
            try:
                return await one.get_leadership(timeout_sec)
            except TimeSliceError as exc:
                return exc
            finally:
                await one.close()

        addresses = [format_target(t) for t in parse_targets(self.target)]
        answers = await asyncio.gather(*(ask(address) for address in addresses))
        return list(zip(addresses, answers, strict=True))

    async def keep_alive(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> LeaseInfo:
        """Renews the job's lease now (the client also does so in the background)."""
        job, group = self._job(job_id), self._group(group_id)
        self._connect()
        holding = self._leases.held(group, job)
        request = hot.keep_alive_request(
            group_id=group, job_id=job, lease_id=holding.lease_id if holding else ""
        )
        sent_at = asyncio.get_running_loop().time()
        timeout = timeout_sec or self._call_timeout_sec
        with map_errors(f"KeepAlive({group}/{job})", NotHolderError):
            response = await self._hot(
                lambda via: call_prepared(via, _KEEP_ALIVE, request, pb.KeepAliveResponse, timeout)
            )
        if holding is not None:
            self._leases.renewed(holding, response, sent_at)
        return lease_info(response)

    def yield_requested(self, job_id: str | None = None, group_id: str | None = None) -> bool:
        """Whether the group asked the job to yield: it held past the group's hold
        limit, and is revoked at the end of the grace period unless it yields.
        Learned from the lease renewals, so only for grants with a lease."""
        holding = self._leases.held(self._group(group_id), self._job(job_id))
        return holding is not None and holding.yield_requested

    def lease_lost(self, job_id: str | None = None, group_id: str | None = None) -> bool:
        """Whether the job's last grant in the group lost its lease (until it acquires
        again): a renewal was refused, or the lease ran out with none heard (the
        process was frozen, say). A job checks it between steps of a hold."""
        group, job = self._group(group_id), self._job(job_id)
        if self._leases.lost(group, job) is not None:
            return True
        return self._loop is not None and self._leases.run_out(group, job, self._loop.time())

    async def watch(self, group_id: str = "") -> AsyncGenerator[WatchEvent, None]:
        """The events of one group, or of every group when ``group_id`` is empty.

        The first event is the group's current status. Until it arrives the stream
        is opened again on the next candidate while the server cannot be reached or
        is a standby (within ``reconnect_timeout_sec``); once it has, the stream has
        no deadline, ends when the server closes it, and is not resumed (a new
        watch starts again from the current status).
        """
        self._connect()
        what = f"Watch({group_id or '*'})"
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        delays = backoff_delays(self._max_backoff_sec)
        while True:
            started = False
            channel, stub = await self._stub()
            try:
                with self._using(channel), map_errors(what, NotHolderError):
                    request = pb.WatchRequest(group_id=group_id)
                    async with own_tasks(stub.watch(request)) as messages:
                        async for message in messages:
                            started = True
                            yield watch_event(message)
                return
            except UnavailableError:
                if started:
                    raise
                now = loop.time()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self._reconnect_timeout_sec:
                    raise
                await asyncio.sleep(
                    min(next(delays), failing_since + self._reconnect_timeout_sec - now)
                )

    async def force_release(
        self,
        group_id: str | None = None,
        job_id: str = "",
        reason: str = "",
        timeout_sec: float | None = None,
    ) -> ForceReleaseResult:
        """Operator action: takes the group's lock from its holder.

        With ``job_id``, only if that job holds it. Not retried: a repeat could
        release the next holder.
        """
        group = self._group(group_id)
        self._connect()
        request = pb.ForceReleaseRequest(group_id=group, job_id=job_id, reason=reason)
        with map_errors(f"ForceRelease({group})", NotHolderError):
            response = await in_own_task(
                self._on(
                    lambda stub: stub.force_release(
                        request, timeout=timeout_sec or self._call_timeout_sec
                    )
                )
            )
        return force_release_result(response)

    async def register_job(
        self,
        backend_config: BackendConfig | None,
        job_id: str | None = None,
        group_id: str | None = None,
        node: str = "",
        timeout_sec: float | None = None,
    ) -> None:
        """Registers the backend the job's contexts need on the group's nodes (on
        ``node`` only, when given): the orchestrator sends it to the agents with
        every switch, so that a plain process is switched through ``cuda_config(pids)``
        and a workload through its channel. ``None`` forgets it."""
        group, job = self._group(group_id), self._job(job_id)
        self._connect()
        request = pb.RegisterJobRequest(
            group_id=group, job_id=job, node=node, backend_config=backend_config
        )
        await self._retrying(
            f"RegisterJob({group}/{job})",
            timeout_sec,
            lambda stub, timeout: stub.register_job(request, timeout=timeout),
        )

    async def reset_job(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> bool:
        """Operator action: lifts the job's quarantine on the group (after a failed
        snapshot or restore), there and on the group's agents. True if it was
        quarantined."""
        group, job = self._group(group_id), self._job(job_id)
        self._connect()
        request = pb.ResetJobRequest(group_id=group, job_id=job)
        response = await self._retrying(
            f"ResetJob({group}/{job})",
            timeout_sec,
            lambda stub, timeout: stub.reset_job(request, timeout=timeout),
        )
        return response.was_quarantined

    async def set_group_nodes(
        self, nodes: Sequence[str], group_id: str | None = None, timeout_sec: float | None = None
    ) -> None:
        """Names the nodes the group spans: node names of agents that register
        themselves, or agent addresses (HOST:PORT). Empty: none."""
        group = self._group(group_id)
        self._connect()
        request = pb.SetGroupNodesRequest(group_id=group, nodes=list(nodes))
        await self._retrying(
            f"SetGroupNodes({group})",
            timeout_sec,
            lambda stub, timeout: stub.set_group_nodes(request, timeout=timeout),
        )

    def on_accelerators(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> OnAccelerators:
        """The lock around a block or a function: ``with``, ``async with``, or a decorator.

        See `OnAccelerators`. Blocking uses of the async client must run in a
        thread other than the one of its event loop.
        """
        job, group = self._job(job_id), self._group(group_id)
        _check_timeout(timeout_sec)
        return OnAccelerators(
            acquire=lambda: self._acquire(job, group, timeout_sec),
            release=lambda error: self._release_after(job, group, error),
            loop=lambda: self._loop,
        )

    def _job(self, job_id: str | None) -> str:
        resolved = job_id or self.job_id
        if not resolved:
            raise InvalidArgumentError(
                "job_id must be provided either in the constructor or in the method call."
            )
        return resolved

    def _group(self, group_id: str | None) -> str:
        resolved = group_id or self.group_id
        if not resolved:
            raise InvalidArgumentError(
                "group_id must be provided either in the constructor or in the method call."
            )
        return resolved

    def _connect(self) -> None:
        if self._closed:
            raise RuntimeError("the orchestrator client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                "the orchestrator client belongs to another event loop; make one per loop"
            )

    async def _stub(self) -> tuple[Channel | None, Stub]:
        """The channel calls go to now (None: the one given) and its stub."""
        self._connect()
        if self._fixed is not None or self._connector is None:
            assert self._fixed is not None
            return None, self._fixed
        channel = await self._connector.channel()
        if self._stubs is None or self._stubs[0] is not channel:
            self._stubs = (channel, Stub(channel))
        return self._stubs

    @contextlib.contextmanager
    def _using(self, channel: Channel | None) -> Iterator[None]:
        """Around a call on `channel`: an error that says its server cannot serve moves
        the client on to its next candidate."""
        try:
            yield
        except BaseException as error:
            if channel is not None and self._connector is not None and unreachable(error):
                self._connector.failed(channel, refused=answered(error), error=error)
            raise

    async def _on(self, send: Callable[[Stub], Awaitable[R]]) -> R:
        """`send(stub)` to the current candidate (moving on if it cannot serve)."""
        channel, stub = await self._stub()
        with self._using(channel):
            return await send(stub)

    async def _hot(self, send: Callable[[Stub | H2Channel], Awaitable[R]]) -> R:
        """`send(via)` of a cycle's call (`call_prepared`) to the current candidate:
        `via` its `H2Channel`, or the stub on grpclib's client."""
        channel, stub = await self._stub()
        unary = None
        if channel is not None and self._connector is not None:
            unary = self._connector.unary(channel)
        with self._using(channel):
            return await send(unary or stub)

    async def _retrying(
        self,
        what: str,
        timeout_sec: float | None,
        send: Callable[[Stub, float], Awaitable[R]],
        denied: type[TimeSliceError] = PermissionDeniedError,
    ) -> R:
        """Sends a call that is safe to repeat, retrying while the server is unreachable.

        Each try gets what is left of ``timeout_sec``, or ``call_timeout_sec``.
        """

        def attempt(left: float | None) -> Awaitable[R]:
            timeout = self._call_timeout_sec if left is None else left
            return self._on(lambda stub: send(stub, timeout))

        return await self._retry(what, timeout_sec, attempt, denied)

    async def _retrying_hot(
        self,
        what: str,
        timeout_sec: float | None,
        send: Callable[[Stub | H2Channel, float], Awaitable[R]],
        denied: type[TimeSliceError] = PermissionDeniedError,
    ) -> R:
        """`_retrying` for a cycle's call, sent through `_hot`."""

        def attempt(left: float | None) -> Awaitable[R]:
            timeout = self._call_timeout_sec if left is None else left
            return self._hot(lambda via: send(via, timeout))

        # `send` is `call_prepared`'s: a grpclib call there has a task of its own.
        return await self._retry(what, timeout_sec, attempt, denied, own_task=False)

    async def _retry(
        self,
        what: str,
        timeout_sec: float | None,
        attempt: Callable[[float | None], Awaitable[R]],
        denied: type[TimeSliceError],
        *,
        own_task: bool = True,
    ) -> R:
        return await call_with_retry(
            attempt,
            what=what,
            budget_sec=timeout_sec,
            reconnect_timeout_sec=self._reconnect_timeout_sec,
            conflict=NotHolderError,
            denied=denied,
            max_backoff_sec=self._max_backoff_sec,
            own_task=own_task,
        )

    async def _acquire(
        self, job: str, group: str, timeout_sec: float | None, more: Sequence[str] = ()
    ) -> AcquireResult:
        self._connect()
        request_id = uuid.uuid4().hex

        def attempt(left: float | None) -> Awaitable[pb.AcquireResponse]:
            # The server gives up waiting at the limit; the call's own deadline,
            # a little later, covers a server that never answers.
            request = hot.acquire_request(
                job_id=job,
                group_id=group,
                request_id=request_id,
                lease_ttl_ms=self._lease_ttl_ms,
                wait_timeout_ms=None if left is None else max(0, round(left * 1000)),
                priority=self._priority,
                more_group_ids=list(more),
            )
            timeout = None if left is None else _acquire_deadline(max(left, 0.0))
            return self._hot(
                lambda via: call_prepared(via, _ACQUIRE, request, pb.AcquireResponse, timeout)
            )

        response = await call_with_retry(
            attempt,
            what=f"Acquire({group}/{job})",
            budget_sec=timeout_sec,
            reconnect_timeout_sec=self._reconnect_timeout_sec,
            conflict=NotHolderError,
            max_backoff_sec=self._max_backoff_sec,
            own_task=False,  # `call_prepared` gives a grpclib call a task of its own
        )
        if more and response.success and len(response.grants) != 1 + len(more):
            await self._refuse_partial_grant(job, [group, *more], response)
        if response.success:
            now = asyncio.get_running_loop().time()
            if not response.grants:
                self._leases.hold(group, job, response.fencing_token, response.lease, now)
            for grant in response.grants:
                self._leases.hold(grant.group_id, job, grant.fencing_token, grant.lease, now)
        return acquire_result(response)

    async def _refuse_partial_grant(
        self, job: str, groups: list[str], response: pb.AcquireResponse
    ) -> None:
        """A server that granted fewer groups than asked (a v1alpha1 one, which reads
        the first group only) is told to release what it granted; then the caller is
        told, since holding one group of a bundle is not what it asked for."""
        granted = [grant.group_id for grant in response.grants] or groups[:1]
        outcome = "released again"
        for group in granted:
            try:
                await self._release(job, group, None)
            except TimeSliceError as error:
                outcome = f"releasing {group} failed ({error.message})"
        raise UnimplementedError(
            f"the orchestrator at {self.target} granted {', '.join(granted)} of"
            f" {', '.join(groups)}: it cannot grant several groups at once (a v1alpha1"
            f" server?); {outcome}"
        )

    async def _release(self, job: str, group: str, timeout_sec: float | None) -> YieldResult:
        self._connect()
        holding = await self._leases.take(group, job)
        request = hot.yield_request(
            job_id=job,
            group_id=group,
            request_id=uuid.uuid4().hex,
            fencing_token=holding.fencing_token if holding and holding.fencing_token else None,
        )
        try:
            # A Yield by a job that does not hold the lock is answered PERMISSION_DENIED
            # (FAILED_PRECONDITION by older servers): NotHolderError either way.
            response = await self._retrying_hot(
                f"Yield({group}/{job})",
                timeout_sec,
                lambda via, timeout: call_prepared(via, _YIELD, request, pb.YieldResponse, timeout),
                denied=NotHolderError,
            )
        except (ConflictError, NotFoundError):
            raise  # the grant is not ours any more: nothing left to release
        except BaseException:
            if holding is not None:
                self._leases.put_back(holding)
            raise
        return yield_result(response)

    async def _release_after(self, job: str, group: str, error: BaseException | None) -> None:
        """Releases at the end of a block; when the block raised, its error wins."""
        if error is None:
            await self._release(job, group, None)
            return
        try:
            await self._release(job, group, None)
        except Exception as release_error:
            logger.warning(
                "releasing %s/%s after %s failed: %s",
                group,
                job,
                type(error).__name__,
                release_error,
            )

    async def _send_keep_alive(self, holding: Holding, timeout: float) -> pb.KeepAliveResponse:
        self._connect()
        request = hot.keep_alive_request(
            group_id=holding.group_id, job_id=holding.job_id, lease_id=holding.lease_id
        )
        with map_errors(f"KeepAlive({holding.group_id}/{holding.job_id})", NotHolderError):
            return await self._hot(
                lambda via: call_prepared(via, _KEEP_ALIVE, request, pb.KeepAliveResponse, timeout)
            )


def _check_timeout(timeout_sec: float | None) -> None:
    if timeout_sec is not None and not timeout_sec >= 0:
        raise InvalidArgumentError(f"timeout_sec must not be negative: {timeout_sec}")
