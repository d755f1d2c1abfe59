"""The messages encoded by hand are byte for byte betterproto2's encoding of the same
message, whatever their values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from timeslice.api import hot
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
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


# --- a switch ------------------------------------------------------------------------------

job_states = st.sampled_from(list(apb.JobState))
statuses = st.sampled_from(list(apb.OperationStatus))
livenesses = st.sampled_from(list(apb.Liveness))


job_statuses = st.fixed_dictionaries(
    {
        "job_id": texts,
        "state": job_states,
        "group": texts,
        "backend": texts,
        "fault": texts,
        "operation_id": texts,
        "liveness": livenesses,
        "store": texts,
    }
)
switch_steps = st.fixed_dictionaries(
    {
        "job_id": texts,
        "kind": texts,
        "operation_id": texts,
        "status": statuses,
        "error": st.none() | texts,
        "storage_bytes": int64,
        "device_bytes": int64,
        "elapsed_ms": int64,
        "refused": st.booleans(),
        "overlapped_ms": int64,
    }
)


@given(job_statuses)
def test_a_job_status(fields: dict[str, Any]) -> None:
    assert hot.job_status(**fields) == bytes(apb.JobStatus(**fields))


@given(switch_steps)
def test_a_switch_step(fields: dict[str, Any]) -> None:
    assert hot.switch_step(**fields) == bytes(apb.SwitchStep(**fields))


@given(
    st.lists(switch_steps, max_size=4),
    st.booleans(),
    job_states,
    st.lists(job_statuses, max_size=3),
    texts,
    st.lists(job_statuses, max_size=4),
    uint64,
)
def test_a_switch_group_response(
    steps: list[dict[str, Any]],
    restored: bool,
    next_state: apb.JobState,
    faulted: list[dict[str, Any]],
    node: str,
    jobs: list[dict[str, Any]],
    version: int,
) -> None:
    ours = hot.switch_group_response(
        steps=[hot.switch_step(**s) for s in steps],
        restored=restored,
        next_state=next_state,
        faulted=[hot.job_status(**j) for j in faulted],
        node_name=node,
        jobs=[hot.job_status(**j) for j in jobs],
        table_version=version,
    )
    theirs = apb.SwitchGroupResponse(
        steps=[apb.SwitchStep(**s) for s in steps],
        restored=restored,
        next_state=next_state,
        faulted=[apb.JobStatus(**j) for j in faulted],
        node_name=node,
        jobs=[apb.JobStatus(**j) for j in jobs],
        table_version=version,
    )
    assert ours == bytes(theirs)
    assert apb.SwitchGroupResponse.FromString(ours).to_dict() == theirs.to_dict()


backends = st.sampled_from(
    [
        None,
        apb.BackendConfig(named=apb.NamedBackendConfig(name="noop")),
        apb.BackendConfig(app_channel=apb.AppChannelConfig()),
    ]
)


switch_jobs = st.builds(
    apb.SwitchJob,
    job_id=texts,
    backend_config=backends,
    snapshot_timeout_ms=int64,
    registered_by=texts,
)


@given(texts, texts, uint64, int64, st.lists(switch_jobs, max_size=4), st.binary(), uint64)
def test_a_switch_group_request(
    group: str,
    next_job: str,
    token: int,
    timeout_ms: int,
    jobs: list[apb.SwitchJob],
    proof: bytes,
    epoch: int,
) -> None:
    ours = hot.switch_group_request(
        group=group,
        next_job_id=next_job,
        fencing_token=token,
        timeout_ms=timeout_ms,
        jobs=b"".join(hot.switch_job(bytes(job)) for job in jobs),
        token_proof=proof,
        orchestrator_epoch=epoch,
    )
    theirs = apb.SwitchGroupRequest(
        group=group,
        next_job_id=next_job,
        fencing_token=token,
        timeout_ms=timeout_ms,
        jobs=jobs,
        token_proof=proof,
        orchestrator_epoch=epoch,
    )
    assert ours == bytes(theirs)


# --- a cycle's requests --------------------------------------------------------------------

optional_int64 = st.none() | int64
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(texts, texts, texts, optional_int64, optional_int64, int32, st.lists(texts, max_size=3))
def test_an_acquire_request(
    job: str,
    group: str,
    request_id: str,
    ttl: int | None,
    wait: int | None,
    priority: int,
    more: list[str],
) -> None:
    fields = {
        "job_id": job,
        "group_id": group,
        "request_id": request_id,
        "lease_ttl_ms": ttl,
        "wait_timeout_ms": wait,
        "priority": priority,
        "more_group_ids": more,
    }
    assert hot.acquire_request(**fields) == bytes(pb.AcquireRequest(**fields))


@given(texts, texts, texts, st.none() | uint64)
def test_a_yield_request(job: str, group: str, request_id: str, token: int | None) -> None:
    fields = {"job_id": job, "group_id": group, "request_id": request_id, "fencing_token": token}
    assert hot.yield_request(**fields) == bytes(pb.YieldRequest(**fields))


@given(texts, texts, texts)
def test_a_keep_alive_request(group: str, job: str, lease_id: str) -> None:
    fields = {"group_id": group, "job_id": job, "lease_id": lease_id}
    assert hot.keep_alive_request(**fields) == bytes(pb.KeepAliveRequest(**fields))
