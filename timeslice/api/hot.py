"""The replies of every handoff, encoded by hand.

Every acquire/yield cycle answers an `AcquireResponse` and a `YieldResponse`,
and a holder's keepalives a `KeepAliveResponse`. betterproto2 encodes a message
by walking its fields and building each one's default value to compare with (in
a `warnings.catch_warnings` block apiece): about 100 us for an AcquireResponse
with its lease, which is a tenth of the orchestrator's CPU per cycle. These
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


# The keys of the fields written here, encoded once.
_K1_VARINT, _K2_VARINT, _K3_VARINT = _key(1, _VARINT), _key(2, _VARINT), _key(3, _VARINT)
_K1_LEN, _K3_LEN = _key(1, _LEN), _key(3, _LEN)
_K100_LEN, _K101_VARINT = _key(100, _LEN), _key(101, _VARINT)
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


def lease(lease_id: str, ttl_ms: int, expires_at: float | None) -> bytes:
    """A `Lease`: its id, its TTL and when it ends (Unix seconds; None: not known)."""
    out = bytearray()
    _text(out, _K1_LEN, lease_id)
    _int(out, _K2_VARINT, ttl_ms)
    if expires_at is not None:
        # As the Timestamp type makes it: through a datetime, to the microsecond.
        offset = datetime.fromtimestamp(expires_at, UTC) - _EPOCH
        micros = (offset.days * 86_400 + offset.seconds) * 10**6 + offset.microseconds
        seconds, us = divmod(micros, 10**6)
        stamp = bytearray()
        _int(stamp, _K1_VARINT, seconds)
        _int(stamp, _K2_VARINT, us * 1000)
        _message(out, _K3_LEN, bytes(stamp))
    return bytes(out)


def acquire_response(
    *, waited_ms: int, context_restored: bool, lease: bytes, fencing_token: int
) -> bytes:
    """A successful `AcquireResponse` of one group (no `grants`); `lease` as `lease()`
    encodes it."""
    out = bytearray(b"\x08\x01")  # success = true
    _int(out, _K2_VARINT, waited_ms)
    _flag(out, _K3_VARINT, context_restored)
    _message(out, _K100_LEN, lease)
    _int(out, _K101_VARINT, fencing_token)
    return bytes(out)


def yield_response(*, pending_waiters: int, snapshot_deferred: bool, next_job_id: str) -> bytes:
    """A successful `YieldResponse`."""
    out = bytearray(b"\x08\x01")  # success = true
    _int(out, _K2_VARINT, pending_waiters)
    _flag(out, _K3_VARINT, snapshot_deferred)
    _text(out, _K100_LEN, next_job_id)
    return bytes(out)


def keep_alive_response(*, lease: bytes, fencing_token: int, yield_requested: bool) -> bytes:
    """A `KeepAliveResponse`; `lease` as `lease()` encodes it."""
    out = bytearray()
    _message(out, _K1_LEN, lease)
    _int(out, _K2_VARINT, fencing_token)
    _flag(out, _K3_VARINT, yield_requested)
    return bytes(out)
