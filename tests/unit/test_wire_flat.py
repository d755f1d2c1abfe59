"""Flat messages (strings, bytes, integers, booleans, enums, maps of strings,
oneofs and messages of those, a Timestamp among them: every message of the
protocol) are read in one pass; what that pass gives, or refuses, is what the
generic strict read (the wire walk, then betterproto2's parser) gives or refuses."""

from __future__ import annotations

import inspect
import re
from datetime import UTC, datetime
from typing import Any

import betterproto2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeslice.api import wire
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb


def flat_types() -> list[type[betterproto2.Message]]:
    found = []
    for module in (pb, apb):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, betterproto2.Message) and wire._flat_plan(cls) is not None:
                found.append(cls)
    return found


FLAT = flat_types()


def generic(message_type: type[Any], data: bytes) -> Any:
    """The strict read every message had before: the wire walk, the parser, then
    the walk of the message against the bounds."""
    wire._check(message_type, memoryview(data), 0)
    try:
        message = message_type.FromString(data)
    except Exception as exc:
        raise ValueError(str(exc)) from exc
    wire._check_bounds(message, message_type.__name__)
    return message


def outcome(read: Any, message_type: type[Any], data: bytes) -> tuple[str, Any]:
    try:
        message = read(message_type, data)
    except ValueError:
        return ("refused", None)
    return ("read", message.to_dict(include_default_values=True))


def flat_read(message_type: type[Any], data: bytes) -> Any:
    plan = wire._flat_plan(message_type)
    assert plan is not None
    message, problem = wire._decode_flat(
        message_type, plan, memoryview(data), message_type.__name__
    )
    if problem is not None:
        raise ValueError(problem)
    return message


def test_the_hot_requests_are_flat() -> None:
    for cls in (pb.AcquireRequest, pb.YieldRequest, pb.KeepAliveRequest, pb.GetGroupStatusRequest):
        assert cls in FLAT
    for cls in (pb.AcquireResponse, pb.YieldResponse, pb.KeepAliveResponse):
        assert cls in FLAT  # a lease's Timestamp too
    assert apb.SwitchGroupResponse in FLAT  # its steps and jobs are flat
    # Bytes, repeated messages, a oneof of messages, a map of strings, packed pids.
    for cls in (apb.SwitchGroupRequest, apb.SnapshotRequest, pb.AgentReport, pb.RegisterJobRequest):
        assert cls in FLAT


def test_every_message_of_the_protocol_is_flat() -> None:
    for module in (pb, apb):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, betterproto2.Message) and cls.__module__ == module.__name__:
                assert cls in FLAT, cls.__name__


def field_bytes(number: int) -> st.SearchStrategy[bytes]:
    """One field of `number` on the wire, well formed or not, of any wire type."""
    varint = st.integers(min_value=0, max_value=2**70).map(_varint)
    key = st.sampled_from([0, 1, 2, 5, 3, 7]).map(lambda w: _varint(number << 3 | w))
    body = st.one_of(
        varint,
        st.binary(max_size=8),
        st.binary(max_size=20).map(lambda b: _varint(len(b)) + b),
        st.text(max_size=10).map(lambda t: _varint(len(t.encode())) + t.encode()),
        st.just(b"\x02\xff\xfe"),  # not UTF-8
        st.just(b"\x10a"),  # runs past the end
    )
    return st.tuples(key, body).map(lambda kb: kb[0] + kb[1])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


@st.composite
def wire_inputs(draw: st.DrawFn) -> tuple[type[Any], bytes]:
    cls = draw(st.sampled_from(FLAT))
    numbers = [m.number for m in cls._betterproto.meta_by_field_name.values()] + [0, 999]
    fields = draw(st.lists(st.sampled_from(numbers).flatmap(field_bytes), max_size=6))
    return cls, b"".join(fields)


@settings(max_examples=500, deadline=None)
@given(wire_inputs())
def test_any_bytes_are_read_or_refused_as_the_generic_read_does(
    case: tuple[type[Any], bytes],
) -> None:
    cls, data = case
    assert outcome(flat_read, cls, data) == outcome(generic, cls, data)


def sample(cls: type[Any]) -> Any:
    """A message of `cls` with every field set away from its default."""
    values: dict[str, Any] = {}
    meta = cls._betterproto
    oneofs: set[str] = set()
    for name, field in meta.meta_by_field_name.items():
        kind = field.proto_type
        if field.group is not None:  # one member of each oneof
            if field.group in oneofs:
                continue
            oneofs.add(field.group)
        if kind == "message" and field.unwrap is not None:  # a Timestamp
            values[name] = datetime(2026, 12, 2, 5, 6, 7, 891011, tzinfo=UTC)
        elif kind == "message":
            nested = meta.cls_by_field[name]
            values[name] = [sample(nested), sample(nested)] if field.repeated else sample(nested)
        elif kind == "map":
            values[name] = {"a": "b", "é": ""}
        elif kind == "bytes":
            values[name] = b"\x00\xff"
        elif kind == "enum":
            members = list(meta.cls_by_field[name])
            values[name] = members[-2:] if field.repeated else members[-1]
        elif kind == "string":
            values[name] = ["a", "é"] if field.repeated else "job-é"
        elif kind == "bool":
            values[name] = True
        elif kind.startswith("u"):
            values[name] = 2**32 + 5 if kind == "uint64" else 7
        else:
            values[name] = [-5, 3] if field.repeated else -5
    message = cls()  # filled in: a deprecated field set would warn in the constructor
    for name, value in values.items():
        setattr(message, name, value)
    return message


@pytest.mark.parametrize("cls", FLAT, ids=lambda c: c.__name__)
def test_a_message_round_trips(cls: type[Any]) -> None:
    message = sample(cls)
    assert flat_read(cls, bytes(message)) == cls.FromString(bytes(message))


@pytest.mark.parametrize("seconds", [2**62, -(2**62), 10**12])
def test_a_timestamp_out_of_range_is_refused_by_both(seconds: int) -> None:
    stamp = b"\x08" + _varint(seconds & (2**64 - 1))
    data = bytes(pb.Lease(lease_id="x")) + b"\x1a" + _varint(len(stamp)) + stamp
    assert (
        outcome(flat_read, pb.Lease, data) == outcome(generic, pb.Lease, data) == ("refused", None)
    )


@pytest.mark.parametrize(
    "entry",
    [b"\x08\x05", b"\x0a\x01a\x10\x05", b"\x0a\x01a\x12\x01b", b"", b"\x0a\x02\xff\xfe"],
    ids=["number-key", "number-value", "strings", "empty", "not-utf8"],
)
def test_a_map_entry_is_read_or_refused_as_the_generic_read_does(entry: bytes) -> None:
    data = b"\x12" + _varint(len(entry)) + entry
    assert outcome(flat_read, apb.NamedBackendConfig, data) == outcome(
        generic, apb.NamedBackendConfig, data
    )


def _named(name: str, options: dict[str, str] | None = None) -> bytes:
    config = apb.BackendConfig(named=apb.NamedBackendConfig(name=name, options=options or {}))
    return bytes(apb.SwitchJob(job_id="j", backend_config=config))


@pytest.mark.parametrize(
    ("cls", "data", "problem"),
    [
        (pb.AcquireRequest, bytes(pb.AcquireRequest(job_id="x" * 257)), "job_id is longer"),
        (pb.AcquireRequest, bytes(pb.AcquireRequest(group_id="g\u202e")), "control or format"),
        (
            pb.AcquireRequest,
            bytes(pb.AcquireRequest(more_group_ids=["g"] * 257)),
            "more_group_ids has more than 256 items",
        ),
        (apb.SwitchJob, _named("n" * 300), "SwitchJob.backend_config.named.name is longer"),
        (apb.SwitchJob, _named("n", {"k\x00": "v"}), "options has an entry that contains"),
        (apb.SwitchJob, _named("n", {"k": "v" * 1025}), "options has an entry that is longer"),
        # a nested message sent twice: the last one is kept, and the one checked
        (apb.SwitchJob, _named("ok") + _named("n" * 300)[3:], "named.name is longer"),
        (apb.SwitchJob, _named("n" * 300) + _named("ok")[3:], None),
        # a singular string sent twice: the same
        (
            pb.AcquireRequest,
            bytes(pb.AcquireRequest(job_id="x" * 257, group_id="")) + b"\n\x01a",
            None,
        ),
        (
            apb.SwitchGroupRequest,
            bytes(apb.SwitchGroupRequest(jobs=[apb.SwitchJob(job_id="j\x07")])),
            "SwitchGroupRequest.jobs.job_id contains",
        ),
    ],
)
def test_bounds_are_checked_in_the_one_pass_as_the_parsed_message_is(
    cls: type[Any], data: bytes, problem: str | None
) -> None:
    assert outcome(flat_read, cls, data) == outcome(generic, cls, data)
    if problem is None:
        wire.decode_strict(cls, data)
        return
    for read in (flat_read, generic, wire.decode_strict):
        with pytest.raises(ValueError, match=re.escape(problem)):
            read(cls, data)


def test_an_agents_answers_hold_as_many_jobs_as_it_may() -> None:
    """An agent keeps up to 4096 jobs (`AgentConfig.max_jobs`): its Status and
    SwitchGroup answers list each of them, and no more."""
    from timeslice.agent.config import AgentConfig

    most = AgentConfig().max_jobs
    statuses = [apb.JobStatus(job_id=f"j{i}") for i in range(most)]
    read = wire.decode_strict(apb.StatusResponse, bytes(apb.StatusResponse(job_statuses=statuses)))
    assert len(read.job_statuses) == most
    steps = [apb.SwitchStep(job_id=f"j{i}") for i in range(most)]
    answer = bytes(apb.SwitchGroupResponse(steps=steps))
    assert len(wire.decode_strict(apb.SwitchGroupResponse, answer).steps) == most
    over = apb.StatusResponse(job_statuses=[*statuses, apb.JobStatus(job_id="one-more")])
    with pytest.raises(ValueError, match="job_statuses has more than 4096 items"):
        wire.decode_strict(apb.StatusResponse, bytes(over))
