"""The orchestrator clients against a small in-test orchestrator over real gRPC.

`FakeOrchestrator` keeps one lock per group with a FIFO queue, just enough to
drive the clients: grants with fencing tokens and leases, DEADLINE_EXCEEDED
when the wait limit runs out, ABORTED for a stale token, and statuses
injected for the next calls of a method.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.testing import ChannelFor

from local_servers import Proxy, listening_socket, start_server, stop_server

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client import (
    AcquireResult,
    AgentJobState,
    AsyncTimeSliceOrchestratorClient,
    GroupLockState,
    OrchestratorTimeoutError,
    TimeSliceOrchestratorClient,
    WatchEventKind,
    YieldResult,
)
from timeslice.errors import (
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    PermissionDeniedError,
    ResourceExhaustedError,
    TimeSliceError,
    UnavailableError,
    UnimplementedError,
)

STATE_SINCE = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


class FakeOrchestrator(pb.TimeSliceOrchestratorServiceBase):
    def __init__(self) -> None:
        self.holders: dict[str, tuple[str, int]] = {}  # group -> (job, fencing token)
        self.tokens: dict[str, int] = defaultdict(int)
        self.loaded: dict[str, str] = {}
        self.queues: dict[str, list[tuple[str, asyncio.Future[int]]]] = defaultdict(list)
        self.calls: dict[str, list[Any]] = defaultdict(list)
        self.call_times: dict[str, list[float]] = defaultdict(list)
        self.fail_next: dict[str, list[Status]] = defaultdict(list)
        self.fail_always: dict[str, Status] = {}
        self.ignore_wait_timeout = False
        self.list_groups_delay = 0.0
        self.watch_events: list[pb.WatchEvent] = []
        self.watch_stays_open = False

    def _receive(self, method: str, request: Any) -> None:
        self.calls[method].append(request)
        self.call_times[method].append(time.monotonic())
        if self.fail_next[method]:
            raise GRPCError(self.fail_next[method].pop(0), f"injected into {method}")
        if method in self.fail_always:
            raise GRPCError(self.fail_always[method], f"injected into {method}")

    def _grant(self, group: str, job: str) -> int:
        self.tokens[group] += 1
        self.holders[group] = (job, self.tokens[group])
        return self.tokens[group]

    def _grant_next(self, group: str) -> str:
        while self.queues[group]:
            job, granted = self.queues[group].pop(0)
            if not granted.done():
                granted.set_result(self._grant(group, job))
                return job
        return ""

    def revoke(self, group: str) -> None:
        del self.holders[group]
        self.tokens[group] += 1

    async def acquire(self, message: pb.AcquireRequest) -> pb.AcquireResponse:
        self._receive("acquire", message)
        group, job = message.group_id, message.job_id
        started = time.monotonic()
        holder = self.holders.get(group)
        if holder is None:
            token = self._grant(group, job)
        elif holder[0] == job:
            token = holder[1]
        else:
            granted = asyncio.get_running_loop().create_future()
            self.queues[group].append((job, granted))
            limit = message.wait_timeout_ms
            try:
                token = await asyncio.wait_for(
                    granted,
                    None if limit is None or self.ignore_wait_timeout else limit / 1000,
                )
            except TimeoutError:
                raise GRPCError(Status.DEADLINE_EXCEEDED, "not granted in time") from None
            finally:
                self.queues[group] = [w for w in self.queues[group] if w[1] is not granted]
        restored = self.loaded.get(group) != job
        self.loaded[group] = job
        ttl_ms = message.lease_ttl_ms or 0
        return pb.AcquireResponse(
            success=True,
            waited_ms=round((time.monotonic() - started) * 1000),
            context_restored=restored,
            fencing_token=token,
            lease=pb.Lease(
                lease_id=f"lease-{group}-{token}",
                ttl_ms=ttl_ms,
                expires_at=datetime.datetime.now(datetime.UTC)
                + datetime.timedelta(milliseconds=ttl_ms),
            )
            if ttl_ms
            else None,
        )

    async def yield_(self, message: pb.YieldRequest) -> pb.YieldResponse:
        self._receive("yield_", message)
        holder = self.holders.get(message.group_id)
        if message.fencing_token is not None and (
            holder is None or holder[1] != message.fencing_token
        ):
            raise GRPCError(Status.ABORTED, "stale fencing token")
        if holder is None or holder[0] != message.job_id:
            raise GRPCError(Status.FAILED_PRECONDITION, "not the holder")
        del self.holders[message.group_id]
        next_job = self._grant_next(message.group_id)
        return pb.YieldResponse(
            success=True,
            pending_waiters=len(self.queues[message.group_id]),
            snapshot_deferred=not next_job,
            next_job_id=next_job,
        )

    async def keep_alive(self, message: pb.KeepAliveRequest) -> pb.KeepAliveResponse:
        self._receive("keep_alive", message)
        holder = self.holders.get(message.group_id)
        if holder is None or holder[0] != message.job_id:
            raise GRPCError(Status.ABORTED, "the lease was revoked")
        return pb.KeepAliveResponse(
            lease=pb.Lease(lease_id=message.lease_id, ttl_ms=300), fencing_token=holder[1]
        )

    async def get_group_status(
        self, message: pb.GetGroupStatusRequest
    ) -> pb.GetGroupStatusResponse:
        self._receive("get_group_status", message)
        group = message.group_id
        holder = self.holders.get(group)
        waiting = [job for job, _ in self.queues[group]]
        return pb.GetGroupStatusResponse(
            group=pb.GroupStatus(
                group_id=group,
                group_state=pb.GroupStatusState.LOCKED if holder else pb.GroupStatusState.IDLE,
                state_timestamp=STATE_SINCE,
                locking_job=holder[0] if holder else "",
                active_job=self.loaded.get(group, ""),
                waiter_queue_depth=len(waiting),
                loaded_job=self.loaded.get(group, ""),
                fencing_token=self.tokens[group],
                waiting_jobs=waiting,
                epoch=3,
            ),
            agent_job_states=[
                pb.SnapshotAgentJobState(
                    agent="node-1", job_id=job, job_state=pb.SnapshotAgentJobStateState.SAVED
                )
                for job in waiting
            ],
        )

    async def list_groups(self, message: pb.ListGroupsRequest) -> pb.ListGroupsResponse:
        self._receive("list_groups", message)
        await asyncio.sleep(self.list_groups_delay)
        return pb.ListGroupsResponse(group_ids=sorted(self.tokens))

    async def watch(self, message: pb.WatchRequest) -> AsyncIterator[pb.WatchEvent]:
        self._receive("watch", message)
        for event in self.watch_events:
            yield event
        if self.watch_stays_open:
            await asyncio.Event().wait()

    async def force_release(self, message: pb.ForceReleaseRequest) -> pb.ForceReleaseResponse:
        self._receive("force_release", message)
        holder = self.holders.pop(message.group_id)
        return pb.ForceReleaseResponse(
            released_job_id=holder[0], next_job_id=self._grant_next(message.group_id)
        )


@pytest.fixture
def fake() -> FakeOrchestrator:
    return FakeOrchestrator()


@pytest.fixture
async def address(fake: FakeOrchestrator) -> AsyncIterator[str]:
    server, address = await start_server([fake])
    yield address
    await stop_server(server)


ClientFactory = Callable[..., AsyncTimeSliceOrchestratorClient]


@pytest.fixture
async def make_client(address: str) -> AsyncIterator[ClientFactory]:
    clients: list[AsyncTimeSliceOrchestratorClient] = []

    def make(job_id: str | None = "a", group_id: str | None = "g", **options: Any) -> Any:
        options.setdefault("target", address)
        client = AsyncTimeSliceOrchestratorClient(job_id=job_id, group_id=group_id, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def eventually(check: Callable[[], bool], within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# --- acquire, release, status ----------------------------------------------


async def test_acquire_sends_ids_lease_and_wait_limit_and_maps_the_answer(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    client = make_client(lease_ttl_sec=5)
    result = await client.acquire(timeout_sec=2.5)

    [request] = fake.calls["acquire"]
    assert (request.job_id, request.group_id) == ("a", "g")
    assert len(request.request_id) == 32 and int(request.request_id, 16) >= 0
    assert request.lease_ttl_ms == 5000
    assert 2000 < request.wait_timeout_ms <= 2500
    assert result.success and result.context_restored
    assert result.fencing_token == 1
    assert (result.lease_id, result.lease_ttl_ms) == ("lease-g-1", 5000)
    assert isinstance(result.lease_expires_at, datetime.datetime)

    await client.release()
    again = await client.acquire()
    assert not again.context_restored  # the same job's context stayed loaded
    assert again.fencing_token == 2
    assert fake.calls["acquire"][1].wait_timeout_ms is None


async def test_no_lease_ttl_asks_for_no_lease_and_sends_no_keepalive(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    client = make_client(lease_ttl_sec=None)
    result = await client.acquire()
    await asyncio.sleep(0.1)

    assert fake.calls["acquire"][0].lease_ttl_ms is None
    assert (result.lease_ttl_ms, result.lease_expires_at) == (0, None)
    assert fake.calls["keep_alive"] == []


async def test_release_sends_the_grants_fencing_token(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    client = make_client()
    acquired = await client.acquire()
    released = await client.release()

    [request] = fake.calls["yield_"]
    assert (request.job_id, request.group_id) == ("a", "g")
    assert request.fencing_token == acquired.fencing_token
    assert request.request_id and request.request_id != fake.calls["acquire"][0].request_id
    assert released == YieldResult(
        success=True, pending_waiters=0, snapshot_deferred=True, next_job_id=""
    )
    assert "g" not in fake.holders


async def test_a_queued_acquire_is_granted_when_the_holder_releases(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    a, b = make_client("a"), make_client("b")
    await a.acquire()
    waiting = asyncio.create_task(b.acquire(timeout_sec=5))
    await eventually(lambda: len(fake.queues["g"]) == 1)
    await asyncio.sleep(0.05)

    released = await a.release()
    granted = await waiting
    assert released.next_job_id == "b" and not released.snapshot_deferred
    assert granted.success and granted.fencing_token == 2 and granted.waited_ms >= 40


async def test_an_acquire_that_waits_too_long_raises_and_leaves_the_queue(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    a, b = make_client("a"), make_client("b")
    await a.acquire()
    with pytest.raises(DeadlineExceededError) as raised:
        await b.acquire(timeout_sec=0.2)
    assert isinstance(raised.value, TimeoutError)
    assert isinstance(raised.value, OrchestratorTimeoutError)
    # The server's own wait ends at the same moment as the call's deadline: on a busy
    # machine the call is cancelled first, and the server drops the waiter just after.
    await eventually(lambda: fake.queues["g"] == [])


@pytest.mark.parametrize(("limit", "ends_after"), [(0.1, 0.3), (1.0, 1.2)])
async def test_an_acquire_the_server_never_answers_ends_soon_after_its_limit(
    fake: FakeOrchestrator, make_client: ClientFactory, limit: float, ends_after: float
) -> None:
    # A server that ignores the wait limit (a v1alpha1 one): the call's own deadline,
    # a tenth of the wait after the limit (at least 0.2 s), ends it.
    fake.ignore_wait_timeout = True
    a, b = make_client("a"), make_client("b")
    await a.acquire()
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        async with asyncio.timeout(3):  # not DeadlineExceededError: fails the test
            await b.acquire(timeout_sec=limit)
    assert ends_after <= time.monotonic() - started < ends_after + 0.4


async def test_an_acquire_without_limit_outlasts_the_call_timeout(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    # Only the waiter has the short call timeout: its acquire must outlast it. (A short
    # one on the holder too would make its release fail on a busy machine.)
    a, b = make_client("a"), make_client("b", call_timeout_sec=0.1)
    await a.acquire()
    waiting = asyncio.create_task(b.acquire())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await a.release()
    assert (await waiting).success


async def test_get_status_maps_every_field(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    a, b, c = make_client("a"), make_client("b"), make_client("c")
    await a.acquire()
    waiters = [asyncio.create_task(b.acquire()), asyncio.create_task(c.acquire())]
    await eventually(lambda: len(fake.queues["g"]) == 2)

    status = await a.get_status()
    group = status.group
    assert group.group_id == "g"
    assert group.group_state is GroupLockState.LOCKED
    assert group.state_timestamp == STATE_SINCE
    assert (group.locking_job, group.active_job, group.loaded_job) == ("a", "a", "a")
    assert group.waiter_queue_depth == 2
    assert group.waiting_jobs == ("b", "c")
    assert (group.fencing_token, group.epoch) == (1, 3)
    assert [(s.agent, s.job_id, s.job_state) for s in status.agent_job_states] == [
        ("node-1", "b", AgentJobState.SAVED),
        ("node-1", "c", AgentJobState.SAVED),
    ]
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_list_groups(fake: FakeOrchestrator, make_client: ClientFactory) -> None:
    await make_client(group_id="g1").acquire()
    await make_client(group_id="g2").acquire()
    assert await make_client().list_groups() == ["g1", "g2"]


async def test_ids_come_from_the_call_or_the_constructor(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    anonymous = make_client(job_id=None, group_id=None)
    with pytest.raises(InvalidArgumentError, match="job_id"):
        anonymous.acquire(group_id="g")
    with pytest.raises(ValueError, match="group_id"):
        await anonymous.release(job_id="a")
    with pytest.raises(InvalidArgumentError):
        await anonymous.get_status()
    assert fake.calls == {}

    await make_client("a", "g").acquire(job_id="x", group_id="y")
    assert (fake.calls["acquire"][0].job_id, fake.calls["acquire"][0].group_id) == ("x", "y")


async def test_a_client_can_use_a_given_channel(fake: FakeOrchestrator) -> None:
    async with ChannelFor([fake]) as channel:
        async with AsyncTimeSliceOrchestratorClient(
            job_id="a", group_id="g", channel=channel
        ) as client:
            assert (await client.acquire()).success
            assert (await client.release()).success


# --- retries ---------------------------------------------------------------


async def test_retries_keep_the_request_id_and_back_off(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    client = make_client()
    fake.fail_next["acquire"] = [Status.UNAVAILABLE] * 3
    started = time.monotonic()
    assert (await client.acquire()).success
    assert time.monotonic() - started >= 0.05 + 0.1 + 0.2
    ids = {request.request_id for request in fake.calls["acquire"]}
    assert len(fake.calls["acquire"]) == 4 and len(ids) == 1

    fake.fail_next["yield_"] = [Status.UNAVAILABLE] * 2
    assert (await client.release()).success
    assert len({request.request_id for request in fake.calls["yield_"]}) == 1
    assert len(fake.calls["yield_"]) == 3

    await client.acquire()
    assert fake.calls["acquire"][-1].request_id not in ids


async def test_retries_give_up_after_the_reconnect_timeout(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    fake.fail_always["acquire"] = Status.UNAVAILABLE
    client = make_client(reconnect_timeout_sec=0.3)
    started = time.monotonic()
    with pytest.raises(UnavailableError):
        await client.acquire()
    assert 0.3 <= time.monotonic() - started < 0.8
    assert len(fake.calls["acquire"]) >= 3


async def test_retries_stop_when_the_acquire_limit_runs_out(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    fake.fail_always["acquire"] = Status.UNAVAILABLE
    client = make_client()
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError, match="unreachable"):
        await client.acquire(timeout_sec=0.3)
    assert 0.3 <= time.monotonic() - started < 0.8
    # Each retry waits only for what is left of the limit.
    limits = [request.wait_timeout_ms for request in fake.calls["acquire"]]
    assert limits == sorted(limits, reverse=True) and limits[-1] < 200


async def test_an_unreachable_server_raises_unavailable() -> None:
    with listening_socket() as sock:
        port = sock.getsockname()[1]
    async with AsyncTimeSliceOrchestratorClient(
        f"127.0.0.1:{port}", "a", "g", reconnect_timeout_sec=0.2
    ) as client:
        with pytest.raises(UnavailableError) as raised:
            await client.list_groups()
    assert isinstance(raised.value, ConnectionError)


async def test_an_acquire_waits_for_a_server_that_starts_late(fake: FakeOrchestrator) -> None:
    with listening_socket() as sock:
        port = sock.getsockname()[1]
    async with AsyncTimeSliceOrchestratorClient(f"127.0.0.1:{port}", "a", "g") as client:
        acquiring = asyncio.create_task(client.acquire())
        await asyncio.sleep(0.2)
        server, _ = await start_server([fake], port)
        try:
            assert (await acquiring).success
            assert len(fake.calls["acquire"]) == 1
        finally:
            await client.close()
            await stop_server(server)


async def test_a_waiter_cut_off_from_the_server_takes_its_place_again(
    fake: FakeOrchestrator, address: str, make_client: ClientFactory
) -> None:
    proxy = Proxy(address)
    holder, waiter = make_client("a"), make_client("b", target=await proxy.start())
    try:
        await holder.acquire()
        waiting = asyncio.create_task(waiter.acquire(timeout_sec=5))
        await eventually(lambda: len(fake.queues["g"]) == 1)

        proxy.cut()
        await eventually(lambda: len(fake.calls["acquire"]) == 3)
        await holder.release()
        assert (await waiting).success
        first, second = fake.calls["acquire"][1:]
        assert first.request_id == second.request_id
    finally:
        await waiter.close()
        await proxy.close()


# --- errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (Status.INVALID_ARGUMENT, InvalidArgumentError),
        (Status.NOT_FOUND, NotFoundError),
        (Status.ALREADY_EXISTS, AlreadyExistsError),
        (Status.PERMISSION_DENIED, PermissionDeniedError),
        (Status.FAILED_PRECONDITION, NotHolderError),
        (Status.ABORTED, LeaseLostError),
        (Status.RESOURCE_EXHAUSTED, ResourceExhaustedError),
        (Status.DEADLINE_EXCEEDED, DeadlineExceededError),
        (Status.UNAVAILABLE, UnavailableError),
        (Status.CANCELLED, CancelledError),
        (Status.UNIMPLEMENTED, UnimplementedError),
        (Status.INTERNAL, InternalError),
        (Status.UNKNOWN, InternalError),
    ],
)
async def test_each_status_raises_its_exception(
    fake: FakeOrchestrator,
    make_client: ClientFactory,
    status: Status,
    expected: type[TimeSliceError],
) -> None:
    fake.fail_always["list_groups"] = status
    with pytest.raises(expected, match="injected into list_groups") as raised:
        await make_client(reconnect_timeout_sec=0).list_groups()
    assert type(raised.value) is expected
    assert raised.value.status == status


async def test_a_slow_answer_raises_deadline_exceeded(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    fake.list_groups_delay = 1.0
    with pytest.raises(DeadlineExceededError):
        await make_client(call_timeout_sec=0.1).list_groups()


# --- leases ----------------------------------------------------------------


async def test_a_lease_is_renewed_every_third_of_its_ttl_until_release(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    client = make_client(lease_ttl_sec=0.3)
    acquired = await client.acquire()
    await asyncio.sleep(0.55)
    renewals = len(fake.calls["keep_alive"])
    assert 3 <= renewals <= 6
    times = fake.call_times["keep_alive"]
    mean_gap = (times[-1] - times[0]) / (len(times) - 1)
    assert 0.09 <= mean_gap < 0.13  # a third of 0.3 s
    request = fake.calls["keep_alive"][0]
    assert (request.group_id, request.job_id, request.lease_id) == ("g", "a", acquired.lease_id)

    await client.release()
    await asyncio.sleep(0.25)
    assert len(fake.calls["keep_alive"]) == renewals
    assert not client.lease_lost()


async def test_a_revoked_lease_is_reported_and_its_late_release_refused(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    lost: list[tuple[str, str, TimeSliceError]] = []
    client = make_client(
        lease_ttl_sec=0.3, on_lease_lost=lambda group, job, error: lost.append((group, job, error))
    )
    await client.acquire()
    fake.revoke("g")
    await eventually(lambda: bool(lost))
    renewals = len(fake.calls["keep_alive"])

    [(group, job, error)] = lost
    assert (group, job) == ("g", "a") and isinstance(error, LeaseLostError)
    assert client.lease_lost() and client.lease_lost("a", "g")
    with pytest.raises(LeaseLostError, match="stale fencing token"):
        await client.release()
    await asyncio.sleep(0.15)
    assert len(fake.calls["keep_alive"]) == renewals

    await client.acquire()
    assert not client.lease_lost()


async def test_a_lease_that_ran_out_while_the_process_was_frozen_is_lost_at_once(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    client = make_client(lease_ttl_sec=0.3)
    await client.acquire()
    assert not client.lease_lost()
    time.sleep(0.45)  # the event loop stands still, as under SIGSTOP: no renewal runs
    assert client.lease_lost()  # before any renewal could say so
    fake.revoke("g")  # as the orchestrator did when the lease ran out
    with pytest.raises(LeaseLostError):
        await client.release()


async def test_an_unknown_lease_is_lost_and_an_async_callback_is_awaited(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    lost = asyncio.Event()

    async def on_lease_lost(group: str, job: str, error: TimeSliceError) -> None:
        assert isinstance(error, NotFoundError)
        await asyncio.sleep(0)
        lost.set()

    fake.fail_next["keep_alive"] = [Status.NOT_FOUND]
    client = make_client(lease_ttl_sec=0.15, on_lease_lost=on_lease_lost)
    await client.acquire()
    await asyncio.wait_for(lost.wait(), 2)
    assert client.lease_lost()


async def test_an_older_server_without_keepalive_is_left_alone(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    lost: list[object] = []
    fake.fail_always["keep_alive"] = Status.UNIMPLEMENTED
    client = make_client(lease_ttl_sec=0.15, on_lease_lost=lambda *args: lost.append(args))
    await client.acquire()
    await asyncio.sleep(0.3)
    assert len(fake.calls["keep_alive"]) == 1
    assert lost == [] and not client.lease_lost()
    assert (await client.release()).success


async def test_renewals_retry_an_unreachable_server_until_the_lease_runs_out(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    lost: list[TimeSliceError] = []
    fake.fail_always["keep_alive"] = Status.UNAVAILABLE
    client = make_client(lease_ttl_sec=0.3, on_lease_lost=lambda g, j, error: lost.append(error))
    await client.acquire()
    granted = time.monotonic()
    await eventually(lambda: bool(lost))

    assert time.monotonic() - granted >= 0.25
    assert len(fake.calls["keep_alive"]) >= 3
    assert isinstance(lost[0], LeaseLostError) and "ran out" in lost[0].message


async def test_a_failure_that_heals_before_expiry_keeps_the_lease(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    fake.fail_next["keep_alive"] = [Status.UNAVAILABLE, Status.INTERNAL]
    client = make_client(lease_ttl_sec=0.6)
    await client.acquire()
    await eventually(lambda: len(fake.calls["keep_alive"]) >= 4)
    assert not client.lease_lost()


async def test_keep_alive_on_demand(fake: FakeOrchestrator, make_client: ClientFactory) -> None:
    client = make_client(lease_ttl_sec=10)
    acquired = await client.acquire()
    lease = await client.keep_alive()
    assert (lease.lease_id, lease.ttl_ms, lease.fencing_token) == (
        acquired.lease_id,
        300,
        acquired.fencing_token,
    )


# --- watch, force release --------------------------------------------------


async def test_watch_maps_the_servers_events(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    fake.watch_events = [
        pb.WatchEvent(kind=pb.WatchEventKind.CURRENT, group_id="g"),
        pb.WatchEvent(
            kind=pb.WatchEventKind.REVOKED,
            group_id="g",
            job_id="a",
            time=STATE_SINCE,
            fencing_token=4,
            reason="lease expired",
            status=pb.GroupStatus(group_id="g", group_state=pb.GroupStatusState.IDLE),
        ),
    ]
    events = [event async for event in make_client().watch("g")]

    assert fake.calls["watch"][0].group_id == "g"
    assert [event.kind for event in events] == [WatchEventKind.CURRENT, WatchEventKind.REVOKED]
    revoked = events[1]
    assert (revoked.job_id, revoked.time, revoked.fencing_token, revoked.reason) == (
        "a",
        STATE_SINCE,
        4,
        "lease expired",
    )
    assert revoked.status is not None and revoked.status.group_state is GroupLockState.IDLE


async def test_a_watch_can_be_left_while_the_stream_is_open(
    fake: FakeOrchestrator, address: str, make_client: ClientFactory
) -> None:
    fake.watch_events = [pb.WatchEvent(kind=pb.WatchEventKind.CURRENT, group_id="g")]
    fake.watch_stays_open = True
    async for event in make_client().watch("g"):
        assert event.kind is WatchEventKind.CURRENT
        break

    def user_code() -> WatchEventKind:
        with TimeSliceOrchestratorClient(address) as client:
            for event in client.watch("g"):
                return event.kind
        raise AssertionError("no event")

    assert await asyncio.wait_for(asyncio.to_thread(user_code), 5) is WatchEventKind.CURRENT


async def test_force_release(fake: FakeOrchestrator, make_client: ClientFactory) -> None:
    a, b = make_client("a"), make_client("b")
    await a.acquire()
    waiting = asyncio.create_task(b.acquire())
    await eventually(lambda: len(fake.queues["g"]) == 1)

    result = await make_client(job_id=None).force_release(job_id="a", reason="stuck")
    request = fake.calls["force_release"][0]
    assert (request.group_id, request.job_id, request.reason) == ("g", "a", "stuck")
    assert (result.released_job_id, result.next_job_id) == ("a", "b")
    assert (await waiting).success


# --- the lock around a block ------------------------------------------------


async def test_async_with_acquire_releases_even_when_the_block_raises(
    fake: FakeOrchestrator, make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    async with client.acquire() as result:
        assert result.success and fake.holders["g"][0] == "a"
    assert "g" not in fake.holders

    fake.fail_always["yield_"] = Status.INTERNAL
    with caplog.at_level(logging.WARNING), pytest.raises(KeyError):
        async with client.acquire():
            raise KeyError("the block's own error")
    assert "releasing g/a after KeyError failed" in caplog.text


Usage = Callable[[Any, list[str]], Awaitable[None]]


async def use_with(lock: Any, seen: list[str]) -> None:
    def body() -> None:
        with lock as result:
            seen.append(f"with {result.success}")
            raise RuntimeError("body failed")

    await asyncio.to_thread(body)


async def use_async_with(lock: Any, seen: list[str]) -> None:
    async with lock as result:
        seen.append(f"async with {result.success}")
        raise RuntimeError("body failed")


async def use_sync_decorator(lock: Any, seen: list[str]) -> None:
    @lock
    def step(x: int) -> None:
        """Trains one step."""
        seen.append(f"sync {x}")
        raise RuntimeError("body failed")

    assert (step.__name__, step.__doc__) == ("step", "Trains one step.")
    await asyncio.to_thread(step, 1)


async def use_async_decorator(lock: Any, seen: list[str]) -> None:
    @lock
    async def step(x: int) -> None:
        """Trains one step."""
        seen.append(f"async {x}")
        raise RuntimeError("body failed")

    assert (step.__name__, step.__doc__) == ("step", "Trains one step.")
    await step(2)


USAGES = [use_with, use_async_with, use_sync_decorator, use_async_decorator]


@pytest.mark.parametrize("usage", USAGES)
async def test_on_accelerators_of_the_async_client(
    fake: FakeOrchestrator, make_client: ClientFactory, usage: Usage
) -> None:
    client = make_client()
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="body failed"):
        await usage(client.on_accelerators(timeout_sec=5), seen)
    assert len(seen) == 1
    assert len(fake.calls["acquire"]) == len(fake.calls["yield_"]) == 1
    assert "g" not in fake.holders


@pytest.mark.parametrize("usage", USAGES)
async def test_on_accelerators_of_the_blocking_client(
    fake: FakeOrchestrator, address: str, usage: Usage
) -> None:
    client = await asyncio.to_thread(TimeSliceOrchestratorClient, address, "a", "g")
    try:
        seen: list[str] = []
        with pytest.raises(RuntimeError, match="body failed"):
            await usage(client.on_accelerators(), seen)
        assert len(seen) == 1
        assert len(fake.calls["acquire"]) == len(fake.calls["yield_"]) == 1
        assert "g" not in fake.holders
    finally:
        await asyncio.to_thread(client.close)


async def test_a_decorated_function_acquires_on_every_call(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    @make_client().on_accelerators()
    async def step(x: int) -> int:
        assert fake.holders["g"][0] == "a"
        return x * 2

    assert [await step(1), await step(2)] == [2, 4]
    assert [r.fencing_token for r in fake.calls["yield_"]] == [1, 2]


async def test_blocking_on_the_async_clients_own_loop_is_refused(
    fake: FakeOrchestrator, make_client: ClientFactory
) -> None:
    client = make_client()
    await client.list_groups()
    with pytest.raises(RuntimeError, match="own event loop"):
        with client.on_accelerators():
            pass
    assert fake.calls["acquire"] == []


# --- the blocking client -----------------------------------------------------


async def test_the_blocking_client_keeps_the_v1alpha1_calls(
    fake: FakeOrchestrator, address: str
) -> None:
    def user_code() -> None:
        with TimeSliceOrchestratorClient(
            address, job_id="a", group_id="g", channel_options=[("grpc.lb_policy_name", "x")]
        ) as client:
            acquired = client.acquire(timeout_sec=5)
            assert isinstance(acquired, AcquireResult) and acquired.success
            assert client.get_status().group.locking_job == "a"
            assert client.list_groups() == ["g"]
            assert client.release() == YieldResult(True, 0, True)
            client.job_id = None
            with pytest.raises(InvalidArgumentError, match="job_id"):
                client.acquire()
        with pytest.raises(RuntimeError, match="closed"):
            client.list_groups()
        client.close()

    await asyncio.to_thread(user_code)
    assert [r.wait_timeout_ms for r in fake.calls["acquire"]] == [5000]
    assert fake.calls["acquire"][0].lease_ttl_ms == 10_000


async def test_the_blocking_client_raises_the_same_exceptions(
    fake: FakeOrchestrator, address: str
) -> None:
    fake.holders["g"] = ("other", 1)

    def user_code() -> None:
        with TimeSliceOrchestratorClient(address, "a", "g") as client:
            with pytest.raises(DeadlineExceededError):
                client.acquire(timeout_sec=0.1)
            with pytest.raises(NotHolderError):
                client.release()

    await asyncio.to_thread(user_code)
    await eventually(lambda: fake.queues["g"] == [])  # as the async client's, above


async def test_the_blocking_client_renews_while_the_caller_computes(
    fake: FakeOrchestrator, address: str
) -> None:
    def user_code() -> None:
        with TimeSliceOrchestratorClient(address, "a", "g", lease_ttl_sec=0.3) as client:
            client.acquire()
            time.sleep(0.5)  # busy with other work, not with the client
            assert not client.lease_lost()
            client.release()

    await asyncio.to_thread(user_code)
    assert len(fake.calls["keep_alive"]) >= 3


async def test_the_blocking_client_watches(fake: FakeOrchestrator, address: str) -> None:
    fake.watch_events = [
        pb.WatchEvent(kind=pb.WatchEventKind.CURRENT, group_id="g"),
        pb.WatchEvent(kind=pb.WatchEventKind.GRANTED, group_id="g", job_id="a"),
    ]

    def user_code() -> list[tuple[WatchEventKind, str]]:
        with TimeSliceOrchestratorClient(address) as client:
            return [(event.kind, event.job_id) for event in client.watch()]

    assert await asyncio.to_thread(user_code) == [
        (WatchEventKind.CURRENT, ""),
        (WatchEventKind.GRANTED, "a"),
    ]
    assert fake.calls["watch"][0].group_id == ""


def test_the_blocking_client_stops_its_thread() -> None:
    client = TimeSliceOrchestratorClient("127.0.0.1:1")
    thread = client._runner.thread
    assert thread.is_alive() and thread.daemon
    client.close()
    client.close()
    assert not thread.is_alive()
