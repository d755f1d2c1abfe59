"""The client's pieces that need no server: targets, result types, error mapping."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import threading

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client import (
    AcquireResult,
    AgentJobState,
    AsyncTimeSliceOrchestratorClient,
    GroupLockState,
    GroupStatus,
    OrchestratorGroupStatus,
    SnapshotAgentJobState,
    TimeSliceOrchestratorClient,
    WatchEventKind,
    YieldResult,
)
from timeslice.client._transport import backoff_cap, backoff_delays, map_errors
from timeslice.ids import Target, parse_target
from timeslice.client.types import acquire_result, group_status, orchestrator_group_status
from timeslice.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseLostError,
    UnavailableError,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:50051", Target(host="localhost", port=50051)),
        (" 10.0.0.7:1 ", Target(host="10.0.0.7", port=1)),
        ("orchestrator.svc.cluster.local:65535", Target("orchestrator.svc.cluster.local", 65535)),
        ("[::1]:8080", Target(host="::1", port=8080)),
        ("[fe80::1%eth0]:8080", Target(host="fe80::1%eth0", port=8080)),
        ("unix:/run/timeslice.sock", Target(path="/run/timeslice.sock")),
        ("unix:///run/timeslice.sock", Target(path="/run/timeslice.sock")),
        ("unix:relative.sock", Target(path="relative.sock")),
    ],
)
def test_targets_that_parse(text: str, expected: Target) -> None:
    assert parse_target(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "host:port"),
        ("localhost", "host:port"),
        (":50051", "host:port"),
        ("localhost:", "1..65535"),
        ("localhost:0", "1..65535"),
        ("localhost:65536", "1..65535"),
        ("localhost:http", "1..65535"),
        ("localhost:-1", "1..65535"),
        ("::1:50051", r"\[::1\]:50051"),
        ("[::1]50051", r"\[ipv6\]:port"),
        ("[::1:50051", r"\[ipv6\]:port"),
        ("[localhost]:50051", "not an IPv6 address"),
        ("http://localhost:50051", "not a host name"),
        ("user@host:50051", "not a host name"),
        ("my host:50051", "not a host name"),
        ("unix:", "path is empty"),
    ],
)
def test_targets_that_do_not_parse(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        parse_target(text)


def test_clients_refuse_a_bad_target_before_they_start() -> None:
    threads = threading.active_count()
    with pytest.raises(InvalidArgumentError, match="port"):
        AsyncTimeSliceOrchestratorClient("localhost:port")
    with pytest.raises(ValueError, match="port"):
        TimeSliceOrchestratorClient("localhost:port")
    assert threading.active_count() == threads


@pytest.mark.parametrize(
    "options",
    [{"lease_ttl_sec": 0}, {"call_timeout_sec": 0}, {"reconnect_timeout_sec": -1}],
)
def test_clients_refuse_bad_options(options: dict[str, float]) -> None:
    threads = threading.active_count()
    with pytest.raises(InvalidArgumentError):
        AsyncTimeSliceOrchestratorClient(**options)
    with pytest.raises(InvalidArgumentError):
        TimeSliceOrchestratorClient(**options)
    assert threading.active_count() == threads


def test_a_negative_acquire_timeout_is_refused() -> None:
    client = AsyncTimeSliceOrchestratorClient(job_id="a", group_id="g")
    with pytest.raises(InvalidArgumentError, match="timeout_sec"):
        client.acquire(timeout_sec=-1)
    with pytest.raises(InvalidArgumentError, match="timeout_sec"):
        client.on_accelerators(timeout_sec=-1)


def test_backoff_doubles_from_50_ms_to_1_s() -> None:
    assert list(itertools.islice(backoff_delays(), 7)) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (GRPCError(Status.ABORTED, "stale"), LeaseLostError),
        (TimeoutError(), DeadlineExceededError),
        (StreamTerminatedError("Connection lost"), UnavailableError),
        (ConnectionRefusedError(111, "refused"), UnavailableError),
        (ConnectionResetError(), UnavailableError),
        (OSError(101, "network unreachable"), UnavailableError),
    ],
)
def test_transport_errors_become_timeslice_errors(
    raised: Exception, expected: type[Exception]
) -> None:
    with pytest.raises(expected) as caught, map_errors("Call"):
        raise raised
    assert type(caught.value) is expected and caught.value.__cause__ is raised


def test_timeslice_errors_pass_through_unchanged() -> None:
    error = UnavailableError("already ours")
    with pytest.raises(UnavailableError) as caught, map_errors("Call"):
        raise error
    assert caught.value is error


def test_the_v1alpha1_results_keep_their_fields_in_order() -> None:
    def names(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    assert names(AcquireResult)[:3] == ["success", "waited_ms", "context_restored"]
    assert names(YieldResult)[:3] == ["success", "pending_waiters", "snapshot_deferred"]
    assert names(SnapshotAgentJobState) == ["agent", "job_id", "job_state"]
    assert names(GroupStatus)[:7] == [
        "group_id",
        "group_state",
        "state_timestamp",
        "locking_job",
        "active_job",
        "waiter_queue_depth",
        "loaded_job",
    ]
    assert names(OrchestratorGroupStatus) == ["group", "agent_job_states"]
    # Constructed as the v1alpha1 client did, positionally; extensions default.
    result = AcquireResult(True, 5, False)
    assert (result.fencing_token, result.lease_id, result.lease_expires_at) == (0, "", None)
    status = GroupStatus("g", GroupLockState.IDLE, None, "", "", 0, "")
    assert (status.fencing_token, status.waiting_jobs, status.epoch) == (0, (), 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.success = False  # type: ignore[misc]
    assert GroupLockState.IDLE_YIELDED == "IDLE_YIELDED"
    assert AgentJobState("SAVED") is AgentJobState.SAVED


@pytest.mark.parametrize(
    ("generated", "ours"),
    [
        (pb.GroupStatusState, GroupLockState),
        (pb.SnapshotAgentJobStateState, AgentJobState),
        (pb.WatchEventKind, WatchEventKind),
    ],
)
def test_every_wire_enum_value_has_our_name(generated: type, ours: type) -> None:
    assert [member.name for member in generated] == [member.name for member in ours]


def test_an_unknown_state_reads_as_unspecified() -> None:
    message = pb.GroupStatus(group_id="g")
    message.group_state = 42  # type: ignore[assignment]
    assert group_status(message).group_state is GroupLockState.UNSPECIFIED


def test_an_answer_without_lease_or_group() -> None:
    assert acquire_result(pb.AcquireResponse(success=True, fencing_token=9)) == AcquireResult(
        success=True, waited_ms=0, context_restored=False, fencing_token=9
    )
    status = orchestrator_group_status(pb.GetGroupStatusResponse(), "g")
    assert status.group.group_id == "g"
    assert status.group.group_state is GroupLockState.UNSPECIFIED
    assert status.agent_job_states == []


def test_an_acquire_result_carries_the_lease() -> None:
    expires = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    result = acquire_result(
        pb.AcquireResponse(
            success=True,
            waited_ms=12,
            context_restored=True,
            fencing_token=3,
            lease=pb.Lease(lease_id="l", ttl_ms=1500, expires_at=expires),
        )
    )
    assert result == AcquireResult(True, 12, True, 3, "l", 1500, expires)


def test_a_client_of_several_orchestrators_retries_sooner() -> None:
    # While standbys refuse, a takeover is under way: its new active is found soon.
    assert backoff_cap(1) == 1.0 and backoff_cap(3) == 0.25
    assert list(itertools.islice(backoff_delays(backoff_cap(3)), 5)) == [
        0.05, 0.1, 0.2, 0.25, 0.25
    ]  # fmt: skip
