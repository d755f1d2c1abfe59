"""The replies encoded by hand are byte for byte betterproto2's encoding of the same
message, whatever their values."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from timeslice.api import hot
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
uint64 = st.integers(min_value=0, max_value=2**64 - 1)
texts = st.text(max_size=80)
# Unix seconds from before 1970 to far ahead, with fractions.
stamps = st.none() | st.floats(min_value=-1e9, max_value=4e9, allow_nan=False)


def lease_message(lease_id: str, ttl_ms: int, expires_at: float | None) -> pb.Lease:
    expires = datetime.fromtimestamp(expires_at, UTC) if expires_at is not None else None
    return pb.Lease(lease_id=lease_id, ttl_ms=ttl_ms, expires_at=expires)


@given(texts, int64, stamps)
def test_a_lease(lease_id: str, ttl_ms: int, expires_at: float | None) -> None:
    assert hot.lease(lease_id, ttl_ms, expires_at) == bytes(
        lease_message(lease_id, ttl_ms, expires_at)
    )


@given(int64, st.booleans(), texts, int64, stamps, uint64)
def test_an_acquire_response(
    waited_ms: int,
    restored: bool,
    lease_id: str,
    ttl_ms: int,
    expires_at: float | None,
    token: int,
) -> None:
    ours = hot.acquire_response(
        waited_ms=waited_ms,
        context_restored=restored,
        lease=hot.lease(lease_id, ttl_ms, expires_at),
        fencing_token=token,
    )
    theirs = pb.AcquireResponse(
        success=True,
        waited_ms=waited_ms,
        context_restored=restored,
        lease=lease_message(lease_id, ttl_ms, expires_at),
        fencing_token=token,
    )
    assert ours == bytes(theirs)
    assert pb.AcquireResponse.FromString(ours).to_dict() == theirs.to_dict()


@given(int64, st.booleans(), texts)
def test_a_yield_response(waiters: int, deferred: bool, next_job: str) -> None:
    ours = hot.yield_response(
        pending_waiters=waiters, snapshot_deferred=deferred, next_job_id=next_job
    )
    theirs = pb.YieldResponse(
        success=True, pending_waiters=waiters, snapshot_deferred=deferred, next_job_id=next_job
    )
    assert ours == bytes(theirs)


@given(texts, int64, stamps, uint64, st.booleans())
def test_a_keep_alive_response(
    lease_id: str, ttl_ms: int, expires_at: float | None, token: int, asked: bool
) -> None:
    ours = hot.keep_alive_response(
        lease=hot.lease(lease_id, ttl_ms, expires_at), fencing_token=token, yield_requested=asked
    )
    theirs = pb.KeepAliveResponse(
        lease=lease_message(lease_id, ttl_ms, expires_at),
        fencing_token=token,
        yield_requested=asked,
    )
    assert ours == bytes(theirs)
