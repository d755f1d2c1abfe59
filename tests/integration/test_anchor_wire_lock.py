"""`benchmarks/anchor_clients.OurWireLock`, ours called as etcd is (grpclib, the
messages written and read by hand): what it writes reads as our protos, what our
protos write it reads, and against a real orchestrator it is a lock: one holder,
the next blocked until the release, the grant's fencing token growing, the
contenders counted as etcd's are."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import anchor_clients as wire
from benchmarks.anchors import until_queued
from benchmarks.common import channel
from timeslice import Orchestrator
from timeslice.api.gen.timeslice_orchestrator.v1alpha1 import (
    AcquireRequest,
    AcquireResponse,
    GetGroupStatusResponse,
    GroupStatus,
    YieldRequest,
    YieldResponse,
)

pytestmark = pytest.mark.timeout(60)

NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=60)
TOKENS = st.integers(min_value=0, max_value=2**63 - 1)


@given(job=NAMES, group=NAMES, token=TOKENS)
def test_its_requests_read_as_ours(job: str, group: str, token: int) -> None:
    data = wire.job_request(job.encode(), group.encode(), token)
    asked = AcquireRequest.parse(wire.job_request(job.encode(), group.encode()))
    released = YieldRequest.parse(data)
    assert (asked.job_id, asked.group_id) == (job, group)
    assert (released.job_id, released.group_id, released.fencing_token or 0) == (job, group, token)


@given(token=TOKENS, waited=st.integers(min_value=0, max_value=2**40))
def test_it_reads_our_grants(token: int, waited: int) -> None:
    granted = AcquireResponse(success=True, waited_ms=waited, fencing_token=token)
    assert wire.granted_token(bytes(granted), "Acquire") == token
    assert wire.granted_token(bytes(YieldResponse(success=True, next_job_id="b")), "Yield") == 0
    with pytest.raises(RuntimeError, match="Acquire answered without success"):
        wire.granted_token(bytes(AcquireResponse(success=False, fencing_token=token)), "Acquire")


@given(holder=st.sampled_from(["", "a"]), waiting=st.lists(NAMES, max_size=20))
def test_it_counts_the_holder_and_the_queue(holder: str, waiting: list[str]) -> None:
    status = GroupStatus(group_id="g", locking_job=holder, waiting_jobs=waiting, fencing_token=9)
    data = bytes(GetGroupStatusResponse(group=status))
    assert wire.contenders_of(data) == bool(holder) + len(waiting)


async def test_it_is_a_lock_against_our_orchestrator(tmp_path: Path) -> None:
    async with Orchestrator(db=f"sqlite:///{tmp_path / 'journal.db'}", port=0) as orch:
        ch_a, ch_b = channel(orch.address), channel(orch.address)
        try:
            a, b = wire.OurWireLock(ch_a, "g"), wire.OurWireLock(ch_b, "g")
            assert a.job != b.job
            await a.acquire()
            first = a.token
            assert first > 0 and await a.contenders() == 1
            waiting = asyncio.create_task(b.acquire())
            await asyncio.wait_for(until_queued(a), 10)  # as the benchmark waits for B
            assert await a.contenders() == 2 and not waiting.done()
            await a.release()
            await asyncio.wait_for(waiting, 10)
            assert b.token > first and a.token == 0
            await b.release()
            assert await b.contenders() == 0
            with pytest.raises(GRPCError) as refused:
                await b.release()  # it holds nothing now
            assert refused.value.status is Status.PERMISSION_DENIED
        finally:
            ch_a.close()
            ch_b.close()
