"""Strict decoding of protobuf messages at the service edge."""

from __future__ import annotations

import datetime as dt

import pytest

from timeslice.api.gen.snapshot_agent import v1alpha1 as agent
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as orch
from timeslice.api.wire import decode_strict


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative numbers as ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


ACQUIRE = orch.AcquireRequest(
    job_id="job", group_id="group", request_id="r-1", lease_ttl_ms=5000, wait_timeout_ms=0
)


# --- well-formed input ---------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        ACQUIRE,
        orch.AcquireRequest(job_id="jöb ✓", group_id="g"),
        orch.AcquireRequest(),
        orch.YieldRequest(job_id="j", group_id="g", request_id="r", fencing_token=2**64 - 1),
        orch.KeepAliveRequest(group_id="g", job_id="j", lease_id="lease-1"),
        orch.ForceReleaseRequest(group_id="g", job_id="j", reason="stuck"),
        orch.WatchRequest(group_id="g"),
        orch.GetGroupStatusResponse(
            group=orch.GroupStatus(
                group_id="g",
                group_state=orch.GroupStatusState.LOCKED,
                state_timestamp=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
                locking_job="a",
                waiter_queue_depth=2,
                fencing_token=7,
                waiting_jobs=["b", "c"],
                holder_lease=orch.Lease(lease_id="lease-7", ttl_ms=1000),
                epoch=3,
            ),
            agent_job_states=[
                orch.SnapshotAgentJobState(
                    agent="node-1", job_state=orch.SnapshotAgentJobStateState.RUNNING, job_id="a"
                )
            ],
        ),
        agent.ProcessTarget(pids=[1, -2, 2**31 - 1]),
        agent.WorkloadCapabilities(
            supported_modes=[agent.SuspendMode(1), agent.SuspendMode(2)], tags=["weights"]
        ),
    ],
    ids=lambda m: type(m).__name__,
)
def test_a_well_formed_message_decodes_to_itself(message: object) -> None:
    data = bytes(message)  # type: ignore[call-overload]
    assert decode_strict(type(message), data) == message  # type: ignore[arg-type]


def test_empty_input_is_the_default_message() -> None:
    assert decode_strict(orch.AcquireRequest, b"") == orch.AcquireRequest()


def test_optional_fields_keep_the_difference_between_unset_and_zero() -> None:
    unset = decode_strict(orch.AcquireRequest, bytes(orch.AcquireRequest(job_id="j")))
    zero = decode_strict(orch.AcquireRequest, bytes(orch.AcquireRequest(wait_timeout_ms=0)))
    assert unset.wait_timeout_ms is None
    assert zero.wait_timeout_ms == 0


@pytest.mark.parametrize(
    "unknown",
    [
        key(50, 0) + varint(123456789),
        key(51, 1) + bytes(8),
        length_delimited(52, b"anything, even \xff bytes"),
        key(53, 5) + bytes(4),
        key(2**29 - 1, 0) + varint(1),  # the largest field number
        length_delimited(54, length_delimited(1, b"nested")),
    ],
    ids=["varint", "fixed64", "bytes", "fixed32", "largest-number", "nested"],
)
def test_unknown_well_formed_fields_are_accepted(unknown: bytes) -> None:
    data = unknown + bytes(ACQUIRE) + unknown
    assert decode_strict(orch.AcquireRequest, data) == ACQUIRE


def test_a_packed_repeated_number_field_is_accepted() -> None:
    payload = varint(1) + varint(-2) + varint(300)
    data = length_delimited(1, payload)
    assert decode_strict(agent.ProcessTarget, data).pids == [1, -2, 300]


def test_an_unpacked_repeated_number_field_is_accepted() -> None:
    data = key(1, 0) + varint(1) + key(1, 0) + varint(-2) + key(1, 0) + varint(300)
    assert decode_strict(agent.ProcessTarget, data).pids == [1, -2, 300]


def test_a_packed_repeated_enum_field_is_accepted() -> None:
    data = length_delimited(1, varint(1) + varint(2))
    decoded = decode_strict(agent.WorkloadCapabilities, data)
    assert decoded.supported_modes == [agent.SuspendMode(1), agent.SuspendMode(2)]


def test_a_deprecated_field_decodes_without_a_warning() -> None:
    # A v1alpha1 client still names its backend by the deprecated enum; the
    # generated constructor would warn of it (an error under these tests' filters).
    data = length_delimited(1, b"j") + key(3, 0) + varint(int(agent.Backend.CUDA))
    decoded = decode_strict(agent.SnapshotRequest, data)
    assert (decoded.job_id, decoded.backend) == ("j", agent.Backend.CUDA)


def test_a_map_of_strings_keeps_the_last_entry_for_a_key() -> None:
    def entry(k: bytes, v: bytes) -> bytes:
        return length_delimited(2, length_delimited(1, k) + length_delimited(2, v))

    data = length_delimited(1, b"noop") + entry(b"a", b"1") + entry(b"b", b"") + entry(b"a", b"2")
    decoded = decode_strict(agent.NamedBackendConfig, data)
    assert (decoded.name, decoded.options) == ("noop", {"a": "2", "b": ""})


# --- malformed input -----------------------------------------------------------------

JOB = length_delimited(1, b"job")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x80", id="truncated key"),
        pytest.param(JOB + key(101, 0) + b"\x80", id="truncated varint value"),
        pytest.param(JOB + key(101, 0) + b"\xff" * 9, id="truncated long varint"),
        pytest.param(JOB + key(101, 0) + b"\xff" * 10 + b"\x01", id="varint over 10 bytes"),
        pytest.param(key(1, 2) + b"\x80", id="truncated length"),
        pytest.param(key(1, 2) + varint(5) + b"ab", id="length past the end"),
        pytest.param(JOB + key(1, 2) + varint(2**40) + b"ab", id="huge length"),
        pytest.param(JOB + key(50, 2) + varint(9) + b"short", id="unknown field past the end"),
        pytest.param(JOB + key(50, 1) + bytes(7), id="unknown fixed64 truncated"),
        pytest.param(JOB + key(50, 5) + bytes(3), id="unknown fixed32 truncated"),
        pytest.param(key(0, 0) + varint(1), id="field number 0"),
    ],
)
def test_truncated_or_overrunning_input_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_strict(orch.AcquireRequest, data)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(key(1, 0) + varint(1), id="string as varint"),
        pytest.param(key(1, 5) + bytes(4), id="string as fixed32"),
        pytest.param(key(101, 2) + varint(1) + b"\x01", id="int64 as bytes"),
        pytest.param(key(101, 1) + bytes(8), id="int64 as fixed64"),
        pytest.param(key(102, 5) + bytes(4), id="optional int64 as fixed32"),
    ],
)
def test_a_known_field_with_the_wrong_wire_type_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="wire type"):
        decode_strict(orch.AcquireRequest, data)


def test_a_repeated_string_field_as_a_varint_is_refused() -> None:
    with pytest.raises(ValueError, match="wire type"):
        decode_strict(agent.WorkloadCapabilities, key(3, 0) + varint(1))


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(key(1, 3) + key(1, 4), id="group of a known field"),
        pytest.param(key(60, 3) + key(60, 4), id="group of an unknown field"),
        pytest.param(key(60, 4), id="end-group alone"),
        pytest.param(key(60, 6), id="wire type 6"),
        pytest.param(key(60, 7), id="wire type 7"),
    ],
)
def test_groups_and_undefined_wire_types_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="wire type"):
        decode_strict(orch.AcquireRequest, JOB + data)


@pytest.mark.parametrize(
    "text",
    [b"\xff", b"\xc3", b"ab\xed\xa0\x80", b"\xc0\xaf"],
    ids=["invalid byte", "truncated sequence", "surrogate", "overlong"],
)
def test_a_string_that_is_not_utf8_is_refused(text: bytes) -> None:
    with pytest.raises(ValueError):
        decode_strict(orch.AcquireRequest, length_delimited(1, text))


def test_a_malformed_nested_message_is_refused() -> None:
    status = bytes(orch.GroupStatus(group_id="g"))
    good = length_delimited(1, status)
    assert decode_strict(orch.GetGroupStatusResponse, good).group.group_id == "g"
    for inner in (
        key(1, 0) + varint(1),  # group_id as a varint
        key(6, 2) + varint(3) + b"abc",  # waiter_queue_depth as bytes
        key(100, 2) + varint(10) + b"x",  # past the end of the nested message
    ):
        with pytest.raises(ValueError):
            decode_strict(orch.GetGroupStatusResponse, length_delimited(1, status + inner))


def test_a_malformed_message_in_a_repeated_field_is_refused() -> None:
    job_state = bytes(orch.SnapshotAgentJobState(agent="n", job_id="a"))
    broken = job_state + key(3, 0) + varint(7)  # job_id as a varint
    data = length_delimited(2, job_state) + length_delimited(2, broken)
    with pytest.raises(ValueError, match="wire type"):
        decode_strict(orch.GetGroupStatusResponse, data)


def test_a_truncated_packed_field_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_strict(agent.ProcessTarget, length_delimited(1, varint(1) + b"\x80"))


@pytest.mark.parametrize(
    "entry",
    [key(1, 0) + varint(5), length_delimited(1, b"a") + key(2, 0) + varint(5), b"\x0a\x05ab"],
    ids=["number-key", "number-value", "truncated"],
)
def test_a_map_entry_that_is_not_two_strings_is_refused(entry: bytes) -> None:
    with pytest.raises(ValueError):
        decode_strict(agent.NamedBackendConfig, length_delimited(2, entry))


def test_a_malformed_field_after_good_ones_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_strict(orch.AcquireRequest, bytes(ACQUIRE) + key(1, 2) + varint(100))


# --- bounds: every string and repeated field, checked at decode ----------------------


@pytest.mark.parametrize(
    "message",
    [
        orch.AcquireRequest(job_id="j" * 257, group_id="g"),
        orch.AcquireRequest(job_id="j", group_id="g", request_id="r" * 400_000),
        orch.YieldRequest(job_id="j", group_id="g", request_id="r" * 257),
        orch.AcquireRequest(job_id="j", group_id="g", more_group_ids=["x"] * 257),
        orch.AcquireRequest(job_id="j\x00", group_id="g"),
        orch.AcquireRequest(job_id="job\u202e", group_id="g"),  # a bidirectional override
        orch.ForceReleaseRequest(group_id="g", reason="r" * 1025),
        agent.GetOperationRequest(operation_id="o" * 400_000),
        agent.SnapshotRequest(
            job_id="j",
            backend_config=agent.BackendConfig(named=agent.NamedBackendConfig("n" * 300)),
        ),
        agent.SnapshotRequest(
            job_id="j",
            backend_config=agent.BackendConfig(
                cuda=agent.CudaBackendConfig(agent.ProcessTarget(pids=list(range(5000))))
            ),
        ),
        agent.WorkloadMessage(result=agent.CommandResult(command_id="c", error="e" * 2000)),
        agent.BackendConfig(named=agent.NamedBackendConfig("n", options={"k" * 300: "v"})),
        agent.BackendConfig(named=agent.NamedBackendConfig("n", options={"k": "v" * 2000})),
        agent.BackendConfig(
            named=agent.NamedBackendConfig("n", options={str(i): "v" for i in range(300)})
        ),
    ],
    ids=lambda m: type(m).__name__,
)
def test_a_field_out_of_its_bounds_is_refused_without_repeating_it(message: object) -> None:
    with pytest.raises(ValueError) as raised:
        decode_strict(type(message), bytes(message))  # type: ignore[arg-type]
    assert len(str(raised.value)) < 200


def test_fields_at_their_bounds_are_accepted() -> None:
    message = orch.AcquireRequest(
        job_id="é" * 128, group_id="g" * 256, request_id="r" * 256, more_group_ids=["x"] * 256
    )
    assert decode_strict(orch.AcquireRequest, bytes(message)) == message
    text = orch.ForceReleaseRequest(group_id="g", reason="line one\nline two " * 50)
    assert decode_strict(orch.ForceReleaseRequest, bytes(text)) == text


def test_two_members_of_one_oneof_are_refused() -> None:
    cuda = length_delimited(1, b"")
    named = length_delimited(100, length_delimited(1, b"noop"))
    config = cuda + named
    with pytest.raises(ValueError, match="both set"):
        decode_strict(agent.BackendConfig, config)
    # inside a request too
    with pytest.raises(ValueError, match="both set"):
        decode_strict(
            agent.SnapshotRequest, length_delimited(1, b"j") + length_delimited(4, config)
        )
    # the same member twice is one member (the last, as the parser reads it)
    assert decode_strict(agent.BackendConfig, cuda + cuda).cuda is not None
