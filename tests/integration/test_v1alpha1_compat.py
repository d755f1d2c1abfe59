"""A program written against the v1alpha1 orchestrator protocol alone works
unchanged against our Orchestrator.

The v1alpha1 protocol (tests/compat/v1alpha1_orchestrator.proto) is compiled
at test time with the official protobuf and gRPC tools, and the Orchestrator is
driven with the official `grpcio` blocking stub: another gRPC implementation
and another protobuf runtime than the ones timeslice uses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from timeslice.orchestrator.server import Orchestrator

from grpcio_compat import compiled, serving_in_thread

pytestmark = pytest.mark.timeout(60)

PROTO = "v1alpha1_orchestrator.proto"
CALL_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def v1alpha1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    """The generated v1alpha1 messages and grpcio stub, as (pb2, pb2_grpc)."""
    with compiled([PROTO], tmp_path_factory.mktemp("v1alpha1_gen")) as modules:
        yield modules["v1alpha1_orchestrator_pb2"], modules["v1alpha1_orchestrator_pb2_grpc"]


@pytest.fixture(params=["grpclib", "h2core"])
def orchestrator_address(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """An Orchestrator serving from a background thread with its own event loop, on
    grpclib's HTTP/2 server and on ours."""
    db = f"sqlite:///{tmp_path / 'journal.db'}"
    http2 = request.param
    with serving_in_thread(
        lambda: Orchestrator(db=db, port=0, http2=http2), "orchestrator"
    ) as address:
        yield address


class V1alpha1Job:
    """A job as a v1alpha1 program writes it: its own channel and blocking stub."""

    def __init__(self, modules: tuple[ModuleType, ModuleType], address: str, job: str, group: str):
        self.pb2, pb2_grpc = modules
        self.job, self.group = job, group
        self.channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
        self.stub = pb2_grpc.TimeSliceOrchestratorServiceStub(self.channel)

    def acquire(self) -> Any:
        request = self.pb2.AcquireRequest(job_id=self.job, group_id=self.group)
        return self.stub.Acquire(request, timeout=CALL_TIMEOUT)

    def yield_(self) -> Any:
        request = self.pb2.YieldRequest(job_id=self.job, group_id=self.group)
        return self.stub.Yield(request, timeout=CALL_TIMEOUT)

    def status(self) -> Any:
        request = self.pb2.GetGroupStatusRequest(group_id=self.group)
        return self.stub.GetGroupStatus(request, timeout=CALL_TIMEOUT).group

    def wait_for_waiters(self, depth: int, timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while (status := self.status()).waiter_queue_depth != depth:
            assert time.monotonic() < deadline, f"never {depth} waiter(s): {status}"
            time.sleep(0.005)
        return status

    def close(self) -> None:
        self.channel.close()


def test_v1alpha1_jobs_alternate_and_see_v1alpha1_status(
    v1alpha1: tuple[ModuleType, ModuleType], orchestrator_address: str
) -> None:
    pb2, _ = v1alpha1
    State = pb2.GroupStatus.State
    group, rounds = "compat", 4
    jobs = {name: V1alpha1Job(v1alpha1, orchestrator_address, name, group) for name in ("a", "b")}
    holds: list[tuple[float, float, str]] = []
    seen: list[Any] = []  # the status each holder saw while the other waited
    last_yield: list[Any] = []
    lock = threading.Lock()

    def run(job: V1alpha1Job, other: str, grants: int, final: bool) -> None:
        for n in range(grants):
            answer = job.acquire()
            granted = time.monotonic()
            assert answer.success
            last = final and n == grants - 1
            if not last:
                status = job.wait_for_waiters(1)
                with lock:
                    seen.append((job.job, status, time.time()))
            yield_sent = time.monotonic()
            with lock:
                holds.append((granted, yield_sent, job.job))
            reply = job.yield_()
            assert reply.success
            assert reply.pending_waiters == (0 if last else 1)
            assert reply.snapshot_deferred == last
            if last:
                last_yield.append(reply)

    try:
        jobs["a"].acquire()  # "a" holds first, so that the order is known
        granted = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            b = pool.submit(run, jobs["b"], "a", rounds, True)
            jobs["a"].wait_for_waiters(1)
            holds.append((granted, time.monotonic(), "a"))
            assert jobs["a"].yield_().pending_waiters == 1
            a = pool.submit(run, jobs["a"], "b", rounds - 1, False)
            a.result(timeout=30)
            b.result(timeout=30)

        holds.sort()
        assert [job for _, _, job in holds] == ["a", "b"] * rounds
        for before, after in zip(holds, holds[1:], strict=False):
            assert before[1] <= after[0], f"{before} overlaps {after}"

        assert len(seen) == 2 * rounds - 2
        for holder, status, when in seen:
            assert status.group_id == group
            assert status.group_state == State.STATE_LOCKED
            assert (status.locking_job, status.active_job, status.loaded_job) == (holder,) * 3
            assert status.waiter_queue_depth == 1
            assert status.HasField("state_timestamp")
            assert abs(status.state_timestamp.ToDatetime().timestamp() - when) < 5

        # "b" yielded last, with nobody waiting: its context stays live.
        assert len(last_yield) == 1
        b_job = jobs["b"]
        idle = b_job.status()
        assert idle.group_state == State.STATE_IDLE_YIELDED
        assert (idle.locking_job, idle.active_job, idle.loaded_job) == ("", "b", "b")
        assert idle.waiter_queue_depth == 0
        assert idle.HasField("state_timestamp")

        listed = b_job.stub.ListGroups(pb2.ListGroupsRequest(), timeout=CALL_TIMEOUT)
        assert list(listed.group_ids) == [group]

        again = b_job.acquire()
        assert again.success
        assert again.context_restored is False
        assert 0 <= again.waited_ms < 500
        status = b_job.status()
        assert (status.group_state, status.locking_job) == (State.STATE_LOCKED, "b")
        assert b_job.yield_().snapshot_deferred
    finally:
        for job in jobs.values():
            job.close()


def test_v1alpha1_programs_get_the_standard_status_codes(
    v1alpha1: tuple[ModuleType, ModuleType], orchestrator_address: str
) -> None:
    pb2, _ = v1alpha1
    holder = V1alpha1Job(v1alpha1, orchestrator_address, "holder", "codes")
    other = V1alpha1Job(v1alpha1, orchestrator_address, "other", "codes")
    try:
        holder.acquire()
        cases = [
            (lambda: other.yield_(), grpc.StatusCode.PERMISSION_DENIED),
            (
                lambda: holder.stub.GetGroupStatus(
                    pb2.GetGroupStatusRequest(group_id="missing"), timeout=CALL_TIMEOUT
                ),
                grpc.StatusCode.NOT_FOUND,
            ),
            (
                lambda: holder.stub.Acquire(
                    pb2.AcquireRequest(job_id="", group_id="codes"), timeout=CALL_TIMEOUT
                ),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
        ]
        for call, code in cases:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == code
        # A waiter that gives up (a client deadline) is not granted later.
        with pytest.raises(grpc.RpcError) as caught:
            other.stub.Acquire(pb2.AcquireRequest(job_id="other", group_id="codes"), timeout=0.3)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        deadline = time.monotonic() + 5
        while holder.status().waiter_queue_depth:
            assert time.monotonic() < deadline, "the abandoned Acquire stayed queued"
            time.sleep(0.01)
        assert holder.yield_().snapshot_deferred
        assert holder.status().active_job == "holder"
    finally:
        holder.close()
        other.close()
