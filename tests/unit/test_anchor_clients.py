"""The protocol-buffer encoding `benchmarks/anchor_clients.py` speaks to etcd with:
what it writes, the protobuf library reads as etcd's messages (built here from
their field numbers), and what the library writes, it reads back."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import anchor_clients as wire

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
F = descriptor_pb2.FieldDescriptorProto

# etcd's messages, as much of them as the client reads or writes (and the header,
# which it skips): (field, number, type).
MESSAGES: dict[str, list[tuple[str, int, int]]] = {
    "ResponseHeader": [("cluster_id", 1, F.TYPE_UINT64), ("member_id", 2, F.TYPE_UINT64),
                       ("revision", 3, F.TYPE_INT64), ("raft_term", 4, F.TYPE_UINT64)],
    "LockRequest": [("name", 1, F.TYPE_BYTES), ("lease", 2, F.TYPE_INT64)],
    "LockResponse": [("header", 1, F.TYPE_MESSAGE), ("key", 2, F.TYPE_BYTES)],
    "UnlockRequest": [("key", 1, F.TYPE_BYTES)],
    "LeaseGrantRequest": [("TTL", 1, F.TYPE_INT64), ("ID", 2, F.TYPE_INT64)],
    "LeaseGrantResponse": [("header", 1, F.TYPE_MESSAGE), ("ID", 2, F.TYPE_INT64),
                           ("TTL", 3, F.TYPE_INT64), ("error", 4, F.TYPE_STRING)],
    "RangeRequest": [("key", 1, F.TYPE_BYTES), ("range_end", 2, F.TYPE_BYTES),
                     ("limit", 3, F.TYPE_INT64), ("count_only", 9, F.TYPE_BOOL)],
    "RangeResponse": [("header", 1, F.TYPE_MESSAGE), ("more", 3, F.TYPE_BOOL),
                      ("count", 4, F.TYPE_INT64)],
}  # fmt: skip


def etcd_messages() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(name="etcd_subset.proto", package="bench",
                                               syntax="proto3")  # fmt: skip
    for name, fields in MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind in fields:
            added = message.field.add(name=field, number=number, type=kind,
                                      label=F.LABEL_OPTIONAL)  # fmt: skip
            if kind == F.TYPE_MESSAGE:
                added.type_name = ".bench.ResponseHeader"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"bench.{name}"))
        for name in MESSAGES
    }


PB = etcd_messages()
HEADER = PB["ResponseHeader"](cluster_id=2**64 - 1, member_id=7, revision=12345, raft_term=3)


@given(name=st.binary(min_size=1, max_size=300), lease=INT64)
def test_a_lock_request_reads_as_etcds(name: bytes, lease: int) -> None:
    parsed = PB["LockRequest"].FromString(wire.lock_request(name, lease))
    assert (parsed.name, parsed.lease) == (name, lease)


@given(key=st.binary(max_size=300))
def test_an_unlock_request_reads_as_etcds(key: bytes) -> None:
    assert PB["UnlockRequest"].FromString(wire.unlock_request(key)).key == key


@given(ttl=INT64, lease=INT64)
def test_a_lease_grant_request_reads_as_etcds(ttl: int, lease: int) -> None:
    parsed = PB["LeaseGrantRequest"].FromString(wire.lease_grant_request(ttl, lease))
    assert (parsed.TTL, parsed.ID) == (ttl, lease)


def test_a_count_request_covers_exactly_the_prefix() -> None:
    parsed = PB["RangeRequest"].FromString(wire.count_request(b"group-0001/"))
    assert (parsed.key, parsed.range_end, parsed.count_only) == (
        b"group-0001/",
        b"group-00010",
        True,
    )


@given(key=st.binary(max_size=300))
def test_the_key_of_a_lock_response_past_its_header(key: bytes) -> None:
    data = PB["LockResponse"](header=HEADER, key=key).SerializeToString()
    assert wire.blob(wire.decode(data), 2) == key


@given(lease=INT64, ttl=INT64)
def test_the_lease_of_a_lease_grant_response(lease: int, ttl: int) -> None:
    data = PB["LeaseGrantResponse"](header=HEADER, ID=lease, TTL=ttl).SerializeToString()
    fields = wire.decode(data)
    assert (wire.granted_lease(data), wire.int64(fields, 3)) == (lease, ttl)


def test_a_lease_grant_error_is_raised() -> None:
    data = PB["LeaseGrantResponse"](header=HEADER, error="too many leases").SerializeToString()
    with pytest.raises(RuntimeError, match="too many leases"):
        wire.granted_lease(data)


@given(count=st.integers(min_value=0, max_value=2**40))
def test_the_count_of_a_range_response(count: int) -> None:
    data = PB["RangeResponse"](header=HEADER, more=True, count=count).SerializeToString()
    assert wire.int64(wire.decode(data), 4) == count


def test_absent_fields_read_as_their_defaults() -> None:
    fields = wire.decode(PB["LockResponse"]().SerializeToString())
    assert (wire.blob(fields, 2), wire.int64(fields, 4)) == (b"", 0)


@pytest.mark.parametrize("data", [b"\x12\x05abc", b"\x10\xff", b"\x0b"])
def test_a_truncated_or_unknown_field_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        wire.decode(data)


def test_wire_hands_grpclib_the_bytes_as_they_are() -> None:
    message = wire.Wire.FromString(b"\x0a\x01x")
    assert message.SerializeToString() == b"\x0a\x01x"
