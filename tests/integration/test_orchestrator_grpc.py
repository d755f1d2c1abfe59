"""The Orchestrator over real gRPC on 127.0.0.1, driven with the generated stub.

Each test starts an Orchestrator with an SQLite journal in a temporary
directory and talks to it as any program would: through TCP, with deadlines.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from orchestrator_wire import (
    call_raw,
    grpc_status,
    orchestrator_stub,
    status_of,
    wait_for_status,
    wait_queued,
)

from tests.waiting import until
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.orchestrator.server import Orchestrator

pytestmark = pytest.mark.timeout(60)

Stub = pb.TimeSliceOrchestratorServiceStub
State = pb.GroupStatusState
Kind = pb.WatchEventKind
MiB = 1024 * 1024


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def journal_url(journal_path: Path) -> str:
    return f"sqlite:///{journal_path}"


@pytest.fixture(params=["grpclib", "h2core"])
async def orch(journal_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Orchestrator]:
    """The orchestrator on grpclib's HTTP/2 server, and on ours."""
    async with Orchestrator(db=journal_url, port=0, http2=request.param) as orchestrator:
        yield orchestrator


@pytest.fixture
async def stub(orch: Orchestrator) -> AsyncIterator[Stub]:
    async with orchestrator_stub(orch.address) as s:
        yield s


def acquire(job: str, group: str, **extensions: Any) -> pb.AcquireRequest:
    return pb.AcquireRequest(job_id=job, group_id=group, **extensions)


def yield_(job: str, group: str, **extensions: Any) -> pb.YieldRequest:
    return pb.YieldRequest(job_id=job, group_id=group, **extensions)


async def start_acquire(stub: Stub, job: str, group: str, **extensions: Any) -> asyncio.Task[Any]:
    """Send an Acquire that is expected to wait, and return once it is queued."""
    task = asyncio.ensure_future(stub.acquire(acquire(job, group, **extensions)))
    await wait_for_status(stub, group, lambda s: job in s.waiting_jobs)
    return task


async def finish(task: asyncio.Task[Any]) -> None:
    """Cancel `task` if it still runs, and wait until it has ended."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class WatchLog:
    """The events of one Watch stream, gathered in the background."""

    def __init__(self) -> None:
        self.events: list[pb.WatchEvent] = []
        self._arrived = asyncio.Condition()

    async def collect(self, stub: Stub, group: str) -> None:
        async for event in stub.watch(pb.WatchRequest(group_id=group), timeout=60):
            async with self._arrived:
                self.events.append(event)
                self._arrived.notify_all()

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[pb.WatchEvent]:
        """Wait until at least `count` events have arrived."""
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.events) >= count), timeout
            )
        return self.events[:count]

    def kinds(self) -> list[tuple[Kind, str]]:
        return [(e.kind, e.job_id) for e in self.events]


@asynccontextmanager
async def journal_writes_held(journal: Path) -> AsyncIterator[None]:
    """Hold the SQLite journal's write lock, so that the Orchestrator's next
    decision waits to be recorded until the block ends."""
    connection = sqlite3.connect(journal, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


@asynccontextmanager
async def watching(stub: Stub, group: str) -> AsyncIterator[WatchLog]:
    """Watch `group`; the first event (KIND_CURRENT) has arrived on entry."""
    log = WatchLog()
    task = asyncio.ensure_future(log.collect(stub, group))
    try:
        await log.wait_for(1)
        yield log
    finally:
        await finish(task)


# --- 1. mutual exclusion under load ----------------------------------------------------


@pytest.mark.slow
async def test_two_jobs_alternate_through_1000_handoffs_without_overlap(orch: Orchestrator) -> None:
    group, handoffs = "alternating", 1000
    holds: list[tuple[float, float, str, int]] = []  # (granted, yield sent, job, token)
    next_jobs: list[str] = []

    async def job(name: str, other: str, grants: int, stub: Stub) -> None:
        for _ in range(grants):
            grant = await stub.acquire(acquire(name, group))
            granted = time.monotonic()
            if len(holds) < handoffs:  # every grant but the last hands over to `other`
                await wait_queued(stub, group, [other], interval=0.001)
            yield_sent = time.monotonic()
            holds.append((granted, yield_sent, name, grant.fencing_token))
            answer = await stub.yield_(yield_(name, group))
            next_jobs.append(answer.next_job_id)

    async with orchestrator_stub(orch.address) as a, orchestrator_stub(orch.address) as b:
        first = asyncio.ensure_future(job("job-a", "job-b", handoffs // 2 + 1, a))
        await wait_for_status(a, group, lambda s: s.locking_job == "job-a")
        second = asyncio.ensure_future(job("job-b", "job-a", handoffs // 2, b))
        await asyncio.wait_for(asyncio.gather(first, second), 50)

    assert len(holds) == handoffs + 1
    assert next_jobs.count("") == 1 and next_jobs[-1] == ""
    holds.sort()
    for before, after in zip(holds, holds[1:], strict=False):
        assert before[1] <= after[0], f"{before} overlaps {after}"
        assert before[3] < after[3], f"fencing token did not grow: {before} then {after}"
        assert before[2] != after[2], "the jobs did not alternate"


# --- 2. a stopped holder loses its lease -------------------------------------------------


@pytest.mark.slow
async def test_stopped_holder_loses_the_lock_within_ttl_and_its_late_yield_is_refused(
    orch: Orchestrator, stub: Stub
) -> None:
    group, ttl = "leased", 1.0
    script = Path(__file__).with_name("lease_holder_job.py")
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        orch.address,
        group,
        "holder",
        str(round(ttl * 1000)),
        "300",
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdout is not None
    waiter: asyncio.Task[pb.AcquireResponse] | None = None
    try:
        word, token = (await asyncio.wait_for(holder.stdout.readline(), 20)).decode().split()
        assert word == "granted"
        waiter = await start_acquire(stub, "waiter", group)
        await asyncio.sleep(1.5 * ttl)  # longer than the TTL: only renewals keep it
        assert (await status_of(stub, group)).locking_job == "holder"

        stopped = time.monotonic()
        os.kill(holder.pid, signal.SIGSTOP)
        grant = await asyncio.wait_for(waiter, ttl + 3)
        lost_after = time.monotonic() - stopped
        assert lost_after <= ttl + 1.0
        assert grant.fencing_token > int(token)

        os.kill(holder.pid, signal.SIGCONT)
        out, _ = await asyncio.wait_for(holder.communicate(), 10)
        assert out.decode().split("\n")[:2] == ["keepalive ABORTED", "yield ABORTED"]
        assert holder.returncode == 0
        status = await status_of(stub, group)
        assert status.locking_job == "waiter"
        assert status.fencing_token == grant.fencing_token
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        if waiter is not None:
            await finish(waiter)


# --- 3. a waiter that goes away is never granted -----------------------------------------


async def test_cancelled_acquire_leaves_the_queue_and_is_never_granted(
    orch: Orchestrator, stub: Stub
) -> None:
    group = "cancel"
    await stub.acquire(acquire("holder", group))
    async with orchestrator_stub(orch.address) as other, watching(stub, group) as log:
        waiter = await start_acquire(other, "quitter", group)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await wait_for_status(stub, group, lambda s: s.waiter_queue_depth == 0)

        answer = await stub.yield_(yield_("holder", group))
        assert (answer.pending_waiters, answer.snapshot_deferred, answer.next_job_id) == (
            0,
            True,
            "",
        )
        status = await status_of(stub, group)
        assert status.group_state == State.IDLE_YIELDED
        assert (status.locking_job, status.active_job, status.waiter_queue_depth) == (
            "",
            "holder",
            0,
        )
        await log.wait_for(4)
        assert log.kinds() == [
            (Kind.CURRENT, ""),
            (Kind.QUEUED, "quitter"),
            (Kind.LEFT_QUEUE, "quitter"),
            (Kind.YIELDED, "holder"),
        ]


async def test_acquire_past_its_client_deadline_is_never_granted(
    orch: Orchestrator, stub: Stub
) -> None:
    group = "deadline"
    await stub.acquire(acquire("holder", group))
    async with watching(stub, group) as log:
        hasty = asyncio.ensure_future(stub.acquire(acquire("hasty", group), timeout=0.5))
        await wait_queued(stub, group, ["hasty"])
        patient = await start_acquire(stub, "patient", group)
        try:
            await hasty
        except GRPCError as exc:
            assert exc.status is Status.DEADLINE_EXCEEDED
        except TimeoutError:
            pass
        else:
            raise AssertionError("an Acquire past its deadline succeeded")
        await wait_queued(stub, group, ["patient"])

        answer = await stub.yield_(yield_("holder", group))
        assert answer.next_job_id == "patient"
        grant = await asyncio.wait_for(patient, 5)
        status = await status_of(stub, group)
        assert (status.locking_job, status.fencing_token) == ("patient", grant.fencing_token)
        granted = [e.job_id for e in await log.wait_for(6) if e.kind == Kind.GRANTED]
        assert granted == ["patient"]


async def test_waiter_that_goes_away_while_its_grant_is_recorded_is_not_left_holding(
    orch: Orchestrator, stub: Stub, journal_path: Path
) -> None:
    group = "handover-race"
    first = await stub.acquire(acquire("holder", group))
    async with orchestrator_stub(orch.address) as quitter_stub, watching(stub, group) as log:
        quitter = await start_acquire(quitter_stub, "quitter", group)
        later = await start_acquire(stub, "later", group)
        async with journal_writes_held(journal_path):
            handover = asyncio.ensure_future(stub.yield_(yield_("holder", group)))
            await wait_for_status(stub, group, lambda s: s.locking_job == "quitter")
            quitter.cancel()  # while the grant to "quitter" is being recorded
            await asyncio.gather(quitter, return_exceptions=True)
            await asyncio.sleep(0.3)
        await asyncio.wait_for(handover, 5)
        grant = await asyncio.wait_for(later, 5)

        status = await status_of(stub, group)
        assert (status.locking_job, status.waiter_queue_depth) == ("later", 0)
        assert status.fencing_token == grant.fencing_token == first.fencing_token + 2
        await log.wait_for(7)
        assert log.kinds()[3:] == [
            (Kind.YIELDED, "holder"),
            (Kind.GRANTED, "quitter"),
            (Kind.REVOKED, "quitter"),
            (Kind.GRANTED, "later"),
        ]
        assert "not delivered" in log.events[5].reason


async def test_grant_nobody_took_leaves_the_yielding_job_active(
    orch: Orchestrator, stub: Stub, journal_path: Path
) -> None:
    group = "handover-race"
    first = await stub.acquire(acquire("holder", group))
    async with orchestrator_stub(orch.address) as quitter_stub:
        quitter = await start_acquire(quitter_stub, "quitter", group)
        async with journal_writes_held(journal_path):
            handover = asyncio.ensure_future(stub.yield_(yield_("holder", group)))
            await wait_for_status(stub, group, lambda s: s.locking_job == "quitter")
            quitter.cancel()
            await asyncio.gather(quitter, return_exceptions=True)
            await asyncio.sleep(0.3)
        await asyncio.wait_for(handover, 5)
    status = await wait_for_status(stub, group, lambda s: s.locking_job == "")
    assert status.fencing_token == first.fencing_token + 1
    assert status.group_state == State.IDLE_YIELDED
    assert (status.active_job, status.loaded_job) == ("holder", "holder")


async def test_holder_keeps_the_lock_when_a_repeated_acquire_is_abandoned(
    stub: Stub, journal_path: Path
) -> None:
    group = "reentry"
    first = await stub.acquire(acquire("holder", group))
    async with journal_writes_held(journal_path):
        repeat = stub.acquire(acquire("holder", group), timeout=0.3)
        with pytest.raises((GRPCError, TimeoutError)):
            await repeat
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.3)
    status = await status_of(stub, group)
    assert (status.locking_job, status.fencing_token) == ("holder", first.fencing_token)


async def test_wait_timeout_gives_deadline_exceeded_and_leaves_the_queue(stub: Stub) -> None:
    group = "wait-limit"
    await stub.acquire(acquire("holder", group))
    started = time.monotonic()
    assert await grpc_status(stub.acquire(acquire("waiter", group, wait_timeout_ms=300))) == (
        Status.DEADLINE_EXCEEDED
    )
    assert 0.25 <= time.monotonic() - started < 3
    status = await status_of(stub, group)
    assert (status.locking_job, status.waiter_queue_depth, list(status.waiting_jobs)) == (
        "holder",
        0,
        [],
    )
    # Zero means: only if it is free now.
    assert await grpc_status(stub.acquire(acquire("waiter", group, wait_timeout_ms=0))) == (
        Status.DEADLINE_EXCEEDED
    )
    assert (await status_of(stub, group)).waiter_queue_depth == 0

    answer = await stub.yield_(yield_("holder", group))
    assert (answer.pending_waiters, answer.next_job_id) == (0, "")
    assert (await status_of(stub, group)).group_state == State.IDLE_YIELDED


# --- 4. bad input: a clear status, and nothing changes -----------------------------------

LONG = "x" * 257
Call = Callable[[Stub, str], Awaitable[Any]]


def _unary(method: str, message: Any) -> Call:
    return lambda stub, _: getattr(stub, method)(message)


def _raw(method: str, payload: bytes) -> Call:
    return lambda _, address: call_raw(address, method, payload)


def _watch(group: str) -> Call:
    return lambda stub, _: _first_event(stub, group)


def _keep_alive(group: str, job: str, lease_id: str) -> Call:
    return _unary("keep_alive", pb.KeepAliveRequest(group_id=group, job_id=job, lease_id=lease_id))


def _force_release(group: str, job: str = "") -> Call:
    return _unary("force_release", pb.ForceReleaseRequest(group_id=group, job_id=job))


def _status(group: str) -> Call:
    return _unary("get_group_status", pb.GetGroupStatusRequest(group_id=group))


# Before each call "a" holds group "g", and group "other" is free. Job "b" is nobody.
BAD_INPUT: dict[Status, dict[str, Call]] = {
    Status.INVALID_ARGUMENT: {
        "acquire-empty-job": _unary("acquire", acquire("", "g")),
        "acquire-empty-group": _unary("acquire", acquire("b", "")),
        "yield-empty-job": _unary("yield_", yield_("", "g")),
        "yield-empty-group": _unary("yield_", yield_("a", "")),
        "status-empty-group": _status(""),
        "acquire-long-job": _unary("acquire", acquire(LONG, "g")),
        "acquire-long-group": _unary("acquire", acquire("b", LONG)),
        # 129 characters, 258 bytes in UTF-8: the limit counts bytes.
        "acquire-long-utf8-job": _unary("acquire", acquire("é" * 129, "g")),
        "yield-long-job": _unary("yield_", yield_(LONG, "g")),
        "status-long-group": _status(LONG),
        "watch-long-group": _watch(LONG),
        "acquire-control-character": _unary("acquire", acquire("b\n", "g")),
        "acquire-negative-ttl": _unary("acquire", acquire("b", "g", lease_ttl_ms=-1)),
        "acquire-zero-ttl": _unary("acquire", acquire("b", "g", lease_ttl_ms=0)),
        "acquire-ttl-over-an-hour": _unary("acquire", acquire("b", "g", lease_ttl_ms=3_600_001)),
        "acquire-negative-wait": _unary("acquire", acquire("b", "g", wait_timeout_ms=-1)),
        "acquire-new-group-negative-ttl": _unary("acquire", acquire("b", "new", lease_ttl_ms=-5)),
        # job_id (field 1) says 5 bytes follow; only 2 do.
        "acquire-truncated-field": _raw("Acquire", b"\x0a\x05ab"),
        # job_id sent as a varint instead of a length-delimited string.
        "acquire-wrong-wire-type": _raw("Acquire", b"\x08\x01\x12\x01g"),
        "acquire-truncated-varint": _raw("Acquire", b"\x0a\x01b\x12\x01g\xa8\x06\xff"),
        "acquire-invalid-utf8": _raw("Acquire", b"\x0a\x02\xff\xfe\x12\x01g"),
        # group_id (field 2) as a 32-bit fixed value.
        "yield-wrong-wire-type": _raw("Yield", b"\x0a\x01a\x15\x00\x00\x00\x00"),
        "yield-truncated-field": _raw("Yield", b"\x0a\x01a\x12\x09g"),
        "status-wrong-wire-type": _raw("GetGroupStatus", b"\x08\x07"),
    },
    Status.NOT_FOUND: {
        "yield-unknown-group": _unary("yield_", yield_("a", "nowhere")),
        "status-unknown-group": _status("nowhere"),
        "force-release-unknown-group": _force_release("nowhere"),
        "keepalive-unknown-group": _keep_alive("nowhere", "a", "lease-1"),
    },
    # As the v1alpha1 server answers a Yield by a job that does not hold the lock.
    Status.PERMISSION_DENIED: {
        "yield-not-holder": _unary("yield_", yield_("b", "g")),
    },
    Status.FAILED_PRECONDITION: {
        "force-release-not-holder": _force_release("g", "b"),
        "force-release-free-group": _force_release("other"),
    },
    Status.ABORTED: {
        "yield-stale-token": _unary("yield_", yield_("a", "g", fencing_token=999)),
        "keepalive-wrong-lease": _keep_alive("g", "a", "lease-999"),
    },
    Status.RESOURCE_EXHAUSTED: {
        "acquire-over-4MiB": _raw("Acquire", bytes(acquire("b", "g", request_id="r" * 4 * MiB))),
        "yield-over-4MiB": _raw("Yield", b"\x0a\x01b\x12\x01g" + b"\x00" * (4 * MiB)),
    },
}


async def _first_event(stub: Stub, group: str) -> pb.WatchEvent:
    async for event in stub.watch(pb.WatchRequest(group_id=group)):
        return event
    raise AssertionError("the watch ended without an event")


async def _everything(stub: Stub) -> tuple[list[str], dict[str, Any]]:
    groups = list((await stub.list_groups()).group_ids)
    return groups, {g: (await status_of(stub, g)).to_dict() for g in groups}


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        pytest.param(call, status, id=name)
        for status, calls in BAD_INPUT.items()
        for name, call in calls.items()
    ],
)
async def test_bad_input_gets_a_clear_status_and_changes_nothing(
    orch: Orchestrator, stub: Stub, call: Call, expected: Status
) -> None:
    await stub.acquire(acquire("a", "g"))
    await stub.acquire(acquire("a", "other"))
    await stub.yield_(yield_("a", "other"))
    before = await _everything(stub)

    assert await grpc_status(call(stub, orch.address)) == expected

    assert await _everything(stub) == before
    # Still serving: the holder can hand over as usual.
    answer = await stub.yield_(yield_("a", "g"))
    assert (answer.success, answer.snapshot_deferred) == (True, True)


async def test_yield_by_a_waiter_is_refused_and_keeps_its_place(stub: Stub) -> None:
    group = "waiting-yield"
    await stub.acquire(acquire("holder", group))
    waiter = await start_acquire(stub, "waiter", group)
    try:
        before = (await status_of(stub, group)).to_dict()
        assert await grpc_status(stub.yield_(yield_("waiter", group))) == Status.PERMISSION_DENIED
        assert (await status_of(stub, group)).to_dict() == before
        assert not waiter.done()
        assert (await stub.yield_(yield_("holder", group))).next_job_id == "waiter"
        await asyncio.wait_for(waiter, 5)
    finally:
        await finish(waiter)


async def test_unknown_well_formed_fields_are_accepted(orch: Orchestrator, stub: Stub) -> None:
    # What a newer client might send: field 900 as a string, field 901 as a varint.
    extra = b"\xa2\x38\x03new\xa8\x38\x07"
    answer = await call_raw(orch.address, "Acquire", bytes(acquire("a", "g")) + extra)
    assert pb.AcquireResponse.FromString(answer).success
    assert (await status_of(stub, "g")).locking_job == "a"


async def test_ids_of_exactly_256_bytes_are_accepted(stub: Stub) -> None:
    job, group = "j" * 256, "ü" * 128
    grant = await stub.acquire(acquire(job, group))
    assert grant.success
    assert (await status_of(stub, group)).locking_job == job
    assert (await stub.yield_(yield_(job, group))).success


async def test_oversized_message_leaves_the_server_healthy(orch: Orchestrator, stub: Stub) -> None:
    for _ in range(3):
        oversized = bytes(acquire("big", "g", request_id="r" * (5 * MiB)))
        assert await grpc_status(call_raw(orch.address, "Acquire", oversized)) == (
            Status.RESOURCE_EXHAUSTED
        )
    # The same channel and a fresh one both still work.
    assert (await stub.acquire(acquire("small", "g"))).success
    async with orchestrator_stub(orch.address) as fresh:
        assert list((await fresh.list_groups()).group_ids) == ["g"]
    # A request just under the limit is read and answered: its bulk in a field
    # this server does not know (a request id that long is out of its bounds).
    padding = 4 * MiB - 64
    unknown = _varint(999 << 3 | 2) + _varint(padding) + b"r" * padding  # field 999, bytes
    under = bytes(yield_("small", "g")) + unknown
    assert len(under) < 4 * MiB
    answer = pb.YieldResponse.FromString(await call_raw(orch.address, "Yield", under))
    assert answer.success
    long_id = bytes(yield_("small", "g", request_id="r" * (4 * MiB - 64)))
    started = time.monotonic()
    assert await grpc_status(call_raw(orch.address, "Yield", long_id)) == Status.INVALID_ARGUMENT
    assert time.monotonic() - started < 2.0


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# --- 5. the extensions -----------------------------------------------------------------


async def test_watch_streams_current_then_queued_granted_yielded_revoked(stub: Stub) -> None:
    group = "watched"
    first = await stub.acquire(acquire("a", group))
    async with watching(stub, group) as log:
        current = log.events[0]
        assert current.kind == Kind.CURRENT
        assert (current.group_id, current.status.locking_job) == (group, "a")
        assert current.status.fencing_token == first.fencing_token

        waiter = await start_acquire(stub, "b", group)
        await stub.yield_(yield_("a", group))
        second = await asyncio.wait_for(waiter, 5)
        released = await stub.force_release(pb.ForceReleaseRequest(group_id=group, reason="drill"))
        assert (released.released_job_id, released.next_job_id) == ("b", "")

        events = await log.wait_for(5)
        assert log.kinds() == [
            (Kind.CURRENT, ""),
            (Kind.QUEUED, "b"),
            (Kind.YIELDED, "a"),
            (Kind.GRANTED, "b"),
            (Kind.REVOKED, "b"),
        ]
        assert all(e.group_id == group for e in events)
        assert events[2].fencing_token == first.fencing_token
        assert events[3].fencing_token == events[4].fencing_token == second.fencing_token
        assert "drill" in events[4].reason
        assert events[3].status.locking_job == "b"
        assert events[4].status.group_state == State.IDLE_YIELDED


async def test_watch_of_every_group_starts_with_each_groups_status(stub: Stub) -> None:
    for group in ("beta", "alpha"):
        await stub.acquire(acquire("a", group))
    async with watching(stub, "") as log:
        await log.wait_for(2)
        await stub.yield_(yield_("a", "beta"))
        await stub.acquire(acquire("b", "gamma"))
        await log.wait_for(4)
    assert [(e.kind, e.group_id) for e in log.events] == [
        (Kind.CURRENT, "alpha"),
        (Kind.CURRENT, "beta"),
        (Kind.YIELDED, "beta"),
        (Kind.GRANTED, "gamma"),
    ]


async def test_waiters_are_granted_first_come_first_served(orch: Orchestrator, stub: Stub) -> None:
    group, jobs = "fifo", [f"job-{n}" for n in range(8)]
    await stub.acquire(acquire("holder", group))
    waiters = {}
    for n, job in enumerate(jobs):
        waiters[job] = asyncio.ensure_future(stub.acquire(acquire(job, group)))
        await wait_queued(stub, group, jobs[: n + 1])
    try:
        tokens = []
        holder = "holder"
        for job in jobs:
            answer = await stub.yield_(yield_(holder, group))
            assert answer.next_job_id == job
            tokens.append((await asyncio.wait_for(waiters[job], 5)).fencing_token)
            holder = job
        assert tokens == sorted(set(tokens))
    finally:
        for task in waiters.values():
            await finish(task)


async def test_a_job_is_queued_once_however_often_it_asks(stub: Stub) -> None:
    group = "once"
    await stub.acquire(acquire("holder", group))
    older = await start_acquire(stub, "twice", group)
    newer = asyncio.ensure_future(stub.acquire(acquire("twice", group)))
    try:
        # The newer call takes the older one's place; the older one is told so.
        assert await grpc_status(asyncio.wait_for(older, 5)) == Status.FAILED_PRECONDITION
        status = await status_of(stub, group)
        assert (list(status.waiting_jobs), status.waiter_queue_depth) == (["twice"], 1)
        await stub.yield_(yield_("holder", group))
        grant = await asyncio.wait_for(newer, 5)
        assert (await status_of(stub, group)).fencing_token == grant.fencing_token
    finally:
        await finish(newer)


async def test_force_release_hands_the_lock_to_the_next_waiter(stub: Stub) -> None:
    group = "forced"
    first = await stub.acquire(acquire("a", group))
    waiter = await start_acquire(stub, "b", group)
    assert (
        await grpc_status(stub.force_release(pb.ForceReleaseRequest(group_id=group, job_id="b")))
        == Status.FAILED_PRECONDITION
    )

    released = await stub.force_release(pb.ForceReleaseRequest(group_id=group, job_id="a"))
    assert (released.released_job_id, released.next_job_id) == ("a", "b")
    second = await asyncio.wait_for(waiter, 5)
    assert second.fencing_token == first.fencing_token + 1
    status = await status_of(stub, group)
    assert (status.locking_job, status.fencing_token, status.waiter_queue_depth) == (
        "b",
        second.fencing_token,
        0,
    )
    # The job that lost the lock cannot release it any more.
    assert await grpc_status(stub.yield_(yield_("a", group))) == Status.PERMISSION_DENIED
    assert (
        await grpc_status(stub.yield_(yield_("a", group, fencing_token=first.fencing_token)))
        == Status.ABORTED
    )
    assert (await status_of(stub, group)).to_dict() == status.to_dict()


async def test_hold_limit_revokes_a_holder_without_a_lease(journal_url: str) -> None:
    group, limit = "limited", 0.5
    async with (
        Orchestrator(db=journal_url, port=0, hold_limit=limit) as orch,
        orchestrator_stub(orch.address) as stub,
    ):
        first = await stub.acquire(acquire("a", group))  # v1alpha1: no lease at all
        granted_at = time.monotonic()
        async with watching(stub, group) as log:
            second = await (await start_acquire(stub, "b", group))
            held_for = time.monotonic() - granted_at
            assert limit * 0.8 <= held_for <= limit + 1.0
            assert second.fencing_token == first.fencing_token + 1
            assert 0 < second.waited_ms <= held_for * 1000 + 100
            events = await log.wait_for(4)
        assert [(e.kind, e.job_id) for e in events[1:]] == [
            (Kind.QUEUED, "b"),
            (Kind.REVOKED, "a"),
            (Kind.GRANTED, "b"),
        ]
        assert "hold limit" in events[2].reason
        assert await grpc_status(stub.yield_(yield_("a", group))) == Status.PERMISSION_DENIED


@pytest.mark.slow
async def test_silent_holder_without_lease_keeps_the_lock(stub: Stub) -> None:
    silent = await stub.acquire(acquire("silent", "no-lease"))
    assert silent.lease.ttl_ms == 0
    leased = await stub.acquire(acquire("leased", "with-lease", lease_ttl_ms=300))
    assert leased.lease.ttl_ms == 300
    waiter = await start_acquire(stub, "waiter", "no-lease")
    try:
        await asyncio.sleep(2.5)  # many times the other holder's TTL
        status = await status_of(stub, "no-lease")
        assert (status.locking_job, list(status.waiting_jobs), status.fencing_token) == (
            "silent",
            ["waiter"],
            silent.fencing_token,
        )
        assert not waiter.done()
        # The leased holder, just as silent, lost its group long ago.
        assert (await status_of(stub, "with-lease")).locking_job == ""
        assert (await stub.yield_(yield_("silent", "no-lease"))).next_job_id == "waiter"
        assert (await asyncio.wait_for(waiter, 5)).fencing_token == silent.fencing_token + 1
    finally:
        await finish(waiter)


async def test_keepalive_extends_the_lease(stub: Stub) -> None:
    group, ttl = "renewed", 0.5
    grant = await stub.acquire(acquire("a", group, lease_ttl_ms=round(ttl * 1000)))
    renewal = pb.KeepAliveRequest(group_id=group, job_id="a", lease_id=grant.lease.lease_id)
    expiries = [grant.lease.expires_at]
    started = time.monotonic()
    while time.monotonic() - started < 3 * ttl:
        await asyncio.sleep(ttl / 4)
        renewed = await stub.keep_alive(renewal)
        assert renewed.fencing_token == grant.fencing_token
        assert renewed.lease.lease_id == grant.lease.lease_id
        expiries.append(renewed.lease.expires_at)
    assert expiries == sorted(expiries) and expiries[-1] > expiries[0]
    status = await status_of(stub, group)
    assert (status.locking_job, status.fencing_token) == ("a", grant.fencing_token)
    assert status.holder_lease.expires_at == expiries[-1]

    stopped = time.monotonic()
    await wait_for_status(stub, group, lambda s: s.locking_job == "", timeout=ttl + 2)
    assert time.monotonic() - stopped <= ttl + 1.0
    assert await grpc_status(stub.keep_alive(renewal)) == Status.ABORTED


async def test_request_id_retries_are_answered_as_the_first_try(stub: Stub) -> None:
    group = "retried"
    first = await stub.acquire(acquire("a", group, request_id="acquire-a"))
    waiter = await start_acquire(stub, "b", group, request_id="acquire-b")

    answer = await stub.yield_(yield_("a", group, request_id="yield-a"))
    assert (answer.success, answer.pending_waiters, answer.next_job_id) == (True, 1, "b")
    second = await asyncio.wait_for(waiter, 5)
    after_yield = (await status_of(stub, group)).to_dict()

    retried = await stub.yield_(yield_("a", group, request_id="yield-a"))
    assert retried.to_dict() == answer.to_dict()
    # A retried Acquire gets the grant it already has, not a new one.
    again = await stub.acquire(acquire("b", group, request_id="acquire-b"))
    assert again.fencing_token == second.fencing_token == first.fencing_token + 1
    assert (await status_of(stub, group)).to_dict() == after_yield
    # Without the request id a second Yield is a new request, and "a" does not hold.
    assert await grpc_status(stub.yield_(yield_("a", group))) == Status.PERMISSION_DENIED

    await stub.yield_(yield_("b", group, request_id="yield-b"))
    # Once that grant has ended, retrying its Acquire does not queue or grant "b" again.
    assert await grpc_status(stub.acquire(acquire("b", group, request_id="acquire-b"))) == (
        Status.ABORTED
    )
    status = await status_of(stub, group)
    assert (status.locking_job, status.waiter_queue_depth, status.fencing_token) == (
        "",
        0,
        second.fencing_token,
    )


# --- 6. restart on the same journal ----------------------------------------------------


def came_back(orch: Orchestrator, group: str, job: str) -> bool:
    """Whether `job`, queued on `group` before the restart, has come back for its place."""
    waiter = orch.table.groups[group].queue.get(job)
    return waiter is not None and bool(waiter.call_id)


async def _hold_and_queue(orch: Orchestrator, group: str) -> tuple[pb.GroupStatus, list[Status]]:
    """'a' holds `group`, 'b' then 'c' wait; then the orchestrator closes under them."""
    async with orchestrator_stub(orch.address) as stub:
        await stub.acquire(acquire("a", group))
        waiters = [await start_acquire(stub, job, group) for job in ("b", "c")]
        status = await wait_queued(stub, group, ["b", "c"])
        await orch.close()
        outcomes = []
        for waiter in waiters:
            try:
                await asyncio.wait_for(waiter, 5)
            except GRPCError as exc:
                outcomes.append(exc.status)
        return status, outcomes


async def test_restart_keeps_holder_queue_and_token_and_drops_waiters_that_do_not_return(
    journal_url: str,
) -> None:
    group, grace = "durable", 1.0
    async with Orchestrator(db=journal_url, port=0, recovery_grace=grace) as first:
        before, outcomes = await _hold_and_queue(first, group)
    assert outcomes == [Status.UNAVAILABLE, Status.UNAVAILABLE]

    second = Orchestrator(db=journal_url, port=0, recovery_grace=grace)
    async with second, orchestrator_stub(second.address) as stub:
        after = await status_of(stub, group)
        assert (after.locking_job, list(after.waiting_jobs), after.fencing_token) == (
            "a",
            ["b", "c"],
            before.fencing_token,
        )
        assert after.epoch == before.epoch + 1
        assert after.group_state == State.LOCKED

        came_back = asyncio.ensure_future(stub.acquire(acquire("b", group)))
        try:
            await wait_queued(stub, group, ["b"], timeout=grace + 3)  # "c" never came back
            answer = await stub.yield_(yield_("a", group))
            assert (answer.pending_waiters, answer.next_job_id) == (1, "b")
            grant = await asyncio.wait_for(came_back, 5)
            assert grant.fencing_token == before.fencing_token + 1
        finally:
            await finish(came_back)


async def test_absent_waiter_at_the_head_does_not_hold_up_the_queue_after_restart(
    journal_url: str,
) -> None:
    group, grace = "durable", 1.0
    async with Orchestrator(db=journal_url, port=0, recovery_grace=grace) as first:
        before, _ = await _hold_and_queue(first, group)

    second = Orchestrator(db=journal_url, port=0, recovery_grace=grace)
    async with second, orchestrator_stub(second.address) as stub:
        restarted = time.monotonic()
        c = asyncio.ensure_future(stub.acquire(acquire("c", group)))  # "b" never comes back
        try:
            await until(lambda: came_back(second, group, "c"), "c came back")
            await stub.yield_(yield_("a", group))
            grant = await asyncio.wait_for(c, grace + 3)
            assert time.monotonic() - restarted <= grace + 1.0
            assert grant.fencing_token > before.fencing_token
            status = await status_of(stub, group)
            assert (status.locking_job, status.waiter_queue_depth) == ("c", 0)
        finally:
            await finish(c)


async def test_waiters_that_come_back_after_restart_keep_their_places(journal_url: str) -> None:
    group, grace = "durable", 5.0
    async with Orchestrator(db=journal_url, port=0, recovery_grace=grace) as first:
        before, _ = await _hold_and_queue(first, group)

    second = Orchestrator(db=journal_url, port=0, recovery_grace=grace)
    async with second, orchestrator_stub(second.address) as stub:
        # They come back in the opposite order; the queue keeps the first order.
        c = asyncio.ensure_future(stub.acquire(acquire("c", group)))
        await until(lambda: came_back(second, group, "c"), "c came back")
        b = asyncio.ensure_future(stub.acquire(acquire("b", group)))
        try:
            await until(lambda: came_back(second, group, "b"), "b came back")
            assert list((await status_of(stub, group)).waiting_jobs) == ["b", "c"]
            await stub.yield_(yield_("a", group))
            b_grant = await asyncio.wait_for(b, 5)
            assert not c.done()
            await stub.yield_(yield_("b", group, fencing_token=b_grant.fencing_token))
            c_grant = await asyncio.wait_for(c, 5)
            assert before.fencing_token < b_grant.fencing_token < c_grant.fencing_token
            status = await status_of(stub, group)
            assert (status.locking_job, status.epoch) == ("c", before.epoch + 1)
        finally:
            await finish(b)
            await finish(c)
