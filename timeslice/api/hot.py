"""The messages of every handoff and every switch, encoded by hand.

Every acquire/yield cycle answers an `AcquireResponse` and a `YieldResponse`,
and a holder's keepalives a `KeepAliveResponse`, to requests our client writes
here too; every switch sends each node a
`SwitchGroupRequest` and has a `SwitchGroupResponse` back. betterproto2 encodes a message
by walking its fields and building each one's default value to compare with (in
a `warnings.catch_warnings` block apiece): about 100 us for an AcquireResponse
with its lease, which is a tenth of the orchestrator's CPU per cycle, and 200 to
300 us for each side of a switch with two jobs (here: 5 to 30 us). These
functions write the same bytes directly, a handful of small fields into one
buffer; `tests/unit/test_hot_replies.py` holds them byte for byte to
betterproto2's encoding of the same message, so the two cannot drift apart
unseen. Every other message, and these with fields the functions do not write
(an AcquireResponse of several groups), is encoded by betterproto2 as before.

Only proto3 rules are needed: a field at its default is left out, an optional
message that is set is written even when empty, varints are base 128 with
negative integers as their 64-bit two's complement.
"""

from __future__ import annotations

from datetime import UTC, datetime

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_VARINT, _LEN = 0, 2


def _varint(value: int, out: bytearray) -> None:
    value &= (1 << 64) - 1
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)


def _key(number: int, wire: int) -> bytes:
    out = bytearray()
    _varint(number << 3 | wire, out)
    return bytes(out)


# The keys of the fields written here, by number and wire type, encoded once.
_KEYS = {
    (number, wire): _key(number, wire)
    for number in (*range(1, 11), *range(100, 106))
    for wire in (_VARINT, _LEN)
}
_TRUE = b"\x01"


def _int(out: bytearray, key: bytes, value: int) -> None:
    if value:
        out += key
        _varint(value, out)


def _flag(out: bytearray, key: bytes, value: bool) -> None:
    if value:
        out += key
        out += _TRUE


def _text(out: bytearray, key: bytes, value: str) -> None:
    if value:
        data = value.encode()
        out += key
        _varint(len(data), out)
        out += data


def _message(out: bytearray, key: bytes, body: bytes) -> None:
    out += key
    _varint(len(body), out)
    out += body


def _bytes(out: bytearray, key: bytes, value: bytes) -> None:
    if value:
        _message(out, key, value)


def lease(lease_id: str, ttl_ms: int, expires_at: float | None) -> bytes:
    """A `Lease`: its id, its TTL and when it ends (Unix seconds; None: not known)."""
    out = bytearray()
    _text(out, _KEYS[1, _LEN], lease_id)
    _int(out, _KEYS[2, _VARINT], ttl_ms)
    if expires_at is not None:
        # As the Timestamp type makes it: through a datetime, to the microsecond.
        offset = datetime.fromtimestamp(expires_at, UTC) - _EPOCH
        micros = (offset.days * 86_400 + offset.seconds) * 10**6 + offset.microseconds
        seconds, us = divmod(micros, 10**6)
        stamp = bytearray()
        _int(stamp, _KEYS[1, _VARINT], seconds)
        _int(stamp, _KEYS[2, _VARINT], us * 1000)
        _message(out, _KEYS[3, _LEN], bytes(stamp))
    return bytes(out)


def acquire_response(
    *, waited_ms: int, context_restored: bool, lease: bytes, fencing_token: int
) -> bytes:
    """A successful `AcquireResponse` of one group (no `grants`); `lease` as `lease()`
    encodes it."""
    out = bytearray(b"\x08\x01")  # success = true
    _int(out, _KEYS[2, _VARINT], waited_ms)
    _flag(out, _KEYS[3, _VARINT], context_restored)
    _message(out, _KEYS[100, _LEN], lease)
    _int(out, _KEYS[101, _VARINT], fencing_token)
    return bytes(out)


def yield_response(*, pending_waiters: int, snapshot_deferred: bool, next_job_id: str) -> bytes:
    """A successful `YieldResponse`."""
    out = bytearray(b"\x08\x01")  # success = true
    _int(out, _KEYS[2, _VARINT], pending_waiters)
    _flag(out, _KEYS[3, _VARINT], snapshot_deferred)
    _text(out, _KEYS[100, _LEN], next_job_id)
    return bytes(out)


def keep_alive_response(*, lease: bytes, fencing_token: int, yield_requested: bool) -> bytes:
    """A `KeepAliveResponse`; `lease` as `lease()` encodes it."""
    out = bytearray()
    _message(out, _KEYS[1, _LEN], lease)
    _int(out, _KEYS[2, _VARINT], fencing_token)
    _flag(out, _KEYS[3, _VARINT], yield_requested)
    return bytes(out)


# --- a cycle's requests (the client's side) ----------------------------------------------


def _optional_int(out: bytearray, key: bytes, value: int | None) -> None:
    """A proto3 `optional` integer: written when set, even to 0."""
    if value is not None:
        out += key
        _varint(value, out)


def acquire_request(
    *,
    job_id: str,
    group_id: str,
    request_id: str,
    lease_ttl_ms: int | None,
    wait_timeout_ms: int | None,
    priority: int,
    more_group_ids: list[str],
) -> bytes:
    """An `AcquireRequest`."""
    out = bytearray()
    _text(out, _KEYS[1, _LEN], job_id)
    _text(out, _KEYS[2, _LEN], group_id)
    _text(out, _KEYS[100, _LEN], request_id)
    _optional_int(out, _KEYS[101, _VARINT], lease_ttl_ms)
    _optional_int(out, _KEYS[102, _VARINT], wait_timeout_ms)
    _int(out, _KEYS[103, _VARINT], priority)
    for group in more_group_ids:  # every item is written, an empty one too
        _message(out, _KEYS[104, _LEN], group.encode())
    return bytes(out)


def yield_request(
    *, job_id: str, group_id: str, request_id: str, fencing_token: int | None
) -> bytes:
    """A `YieldRequest`."""
    out = bytearray()
    _text(out, _KEYS[1, _LEN], job_id)
    _text(out, _KEYS[2, _LEN], group_id)
    _text(out, _KEYS[100, _LEN], request_id)
    _optional_int(out, _KEYS[101, _VARINT], fencing_token)
    return bytes(out)


def keep_alive_request(*, group_id: str, job_id: str, lease_id: str) -> bytes:
    """A `KeepAliveRequest`."""
    out = bytearray()
    _text(out, _KEYS[1, _LEN], group_id)
    _text(out, _KEYS[2, _LEN], job_id)
    _text(out, _KEYS[3, _LEN], lease_id)
    return bytes(out)


class Prepared:
    """A message encoded here, which a generated stub sends as it is: grpclib's
    codec asks a message for `SerializeToString` (and a type for `FromString`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def FromString(cls, data: bytes) -> Prepared:  # noqa: N802 (the protobuf runtime's name)
        return cls(data)

    def SerializeToString(self) -> bytes:  # noqa: N802
        return self.data


# --- a switch (snapshot_agent.v1alpha1) -------------------------------------------------


def switch_job(job: bytes) -> bytes:
    """A `SwitchJob` (as betterproto2 encodes it, `bytes(message)`) framed as one of
    a `SwitchGroupRequest`'s `jobs`: what `switch_group_request` joins."""
    out = bytearray()
    _message(out, _KEYS[5, _LEN], job)
    return bytes(out)


def switch_group_request(
    *,
    group: str,
    next_job_id: str,
    fencing_token: int,
    timeout_ms: int,
    jobs: bytes,
    token_proof: bytes,
    orchestrator_epoch: int,
) -> bytes:
    """A `SwitchGroupRequest`; `jobs` its jobs as `switch_job` frames them, joined."""
    out = bytearray()
    _text(out, _KEYS[1, _LEN], group)
    _text(out, _KEYS[2, _LEN], next_job_id)
    _int(out, _KEYS[3, _VARINT], fencing_token)
    _int(out, _KEYS[4, _VARINT], timeout_ms)
    out += jobs
    _bytes(out, _KEYS[6, _LEN], token_proof)
    _int(out, _KEYS[7, _VARINT], orchestrator_epoch)
    return bytes(out)


def job_status(
    *,
    job_id: str,
    state: int,
    group: str,
    backend: str,
    fault: str,
    operation_id: str,
    liveness: int,
    store: str,
) -> bytes:
    """A `JobStatus` (its enums by number)."""
    out = bytearray()
    _text(out, _KEYS[1, _LEN], job_id)
    _int(out, _KEYS[2, _VARINT], state)
    _text(out, _KEYS[100, _LEN], group)
    _text(out, _KEYS[101, _LEN], backend)
    _text(out, _KEYS[102, _LEN], fault)
    _text(out, _KEYS[103, _LEN], operation_id)
    _int(out, _KEYS[104, _VARINT], liveness)
    _text(out, _KEYS[105, _LEN], store)
    return bytes(out)


def switch_step(
    *,
    job_id: str,
    kind: str,
    operation_id: str = "",
    status: int,
    error: str | None = None,
    storage_bytes: int = 0,
    device_bytes: int = 0,
    elapsed_ms: int = 0,
    refused: bool = False,
    overlapped_ms: int = 0,
) -> bytes:
    """A `SwitchStep` (its status by number; `error` None: not set, "" is written)."""
    out = bytearray()
    _text(out, _KEYS[1, _LEN], job_id)
    _text(out, _KEYS[2, _LEN], kind)
    _text(out, _KEYS[3, _LEN], operation_id)
    _int(out, _KEYS[4, _VARINT], status)
    if error is not None:  # proto3 optional: written when set, even empty
        _message(out, _KEYS[5, _LEN], error.encode())
    _int(out, _KEYS[6, _VARINT], storage_bytes)
    _int(out, _KEYS[7, _VARINT], device_bytes)
    _int(out, _KEYS[8, _VARINT], elapsed_ms)
    _flag(out, _KEYS[9, _VARINT], refused)
    _int(out, _KEYS[10, _VARINT], overlapped_ms)
    return bytes(out)


def switch_group_response(
    *,
    steps: list[bytes],
    restored: bool,
    next_state: int,
    faulted: list[bytes],
    node_name: str,
    jobs: list[bytes],
    table_version: int,
) -> bytes:
    """A `SwitchGroupResponse`; its steps and job statuses as `switch_step` and
    `job_status` encode them."""
    out = bytearray()
    for step in steps:
        _message(out, _KEYS[1, _LEN], step)
    _flag(out, _KEYS[2, _VARINT], restored)
    _int(out, _KEYS[3, _VARINT], next_state)
    for job in faulted:
        _message(out, _KEYS[4, _LEN], job)
    _text(out, _KEYS[5, _LEN], node_name)
    for job in jobs:
        _message(out, _KEYS[6, _LEN], job)
    _int(out, _KEYS[7, _VARINT], table_version)
    return bytes(out)
