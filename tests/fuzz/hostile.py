"""Hostile protobuf bodies and gRPC frames, encoded by hand: what the generated
classes never write (bytes that are not UTF-8, varints of any size, fields of
the wrong wire type, unknown fields, a field twice, two members of one oneof),
with ids drawn from `Pools` often enough to meet the state earlier calls made."""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import betterproto2

MiB: Final = 1024 * 1024


@dataclass
class Pools:
    """The ids requests draw from, so that they meet the state earlier ones made;
    answers add operation ids and grants."""

    node: str
    agent_address: str
    jobs: tuple[str, ...] = ("j0", "j1", "j2", "j3", "j4", "j5")
    groups: tuple[str, ...] = ("g0", "g1", "g2", "g3")
    operations: list[str] = field(default_factory=list)
    # (group, job) -> (fencing token, lease id) of the latest grant seen
    grants: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)

    @property
    def nodes(self) -> tuple[str, ...]:
        # An address nothing listens on fails at once: a switch through it does not wait.
        return (self.node, self.agent_address, "127.0.0.1:1", "fz-node")

    def remember_operation(self, op_id: str) -> None:
        self.operations.append(op_id)
        del self.operations[:-64]

    def token(self, rng: random.Random, group: str) -> int:
        known = [token for (g, _), (token, _) in self.grants.items() if g == group]
        fallback = rng.choice(TOKENS)
        return pick(rng, known, fallback) if rng.random() < 0.7 else fallback


def pick(rng: random.Random, seen: list[Any], fallback: Any) -> Any:
    """One of `seen` (what answers named), else `fallback`, drawing the same
    randomness whatever their number: what follows in a request stays the same
    however many answers came before it."""
    at = rng.random()
    return seen[int(at * len(seen))] if seen else fallback


# --- hostile values -----------------------------------------------------------------

_CONTROL: Final = ["\x00", "j\x00b", "a\nb", "\r\n", "\x1b[2J", "\x7f", "g\x85", "\x08"]
_FORMAT: Final = ["\u202eg0", "a\u200bb", "\ufeffg", "\u2066x\u2069", "soft\u00adhyphen"]
_NOT_UTF8: Final = [b"\xff", b"\xfe\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\x80", b"g\xe2\x82",
                    b"\xf4\x90\x80\x80", b"j0\xff"]  # fmt: skip
_ODD: Final = ["日本語", "🙂" * 10, "e\u0301", " g0", "g0 ", "\t", "..", "/", "*", "%s%n",
               "{}", "' OR 1=1 --", "lease-1", "lease-18446744073709551615", "127.0.0.1:1",
               "[::1]:1", "unix:/nonexistent/agent.sock", "unix:", "127.0.0.1:0",
               "127.0.0.1:99999", ":80", "[zz]:1", "é" * 128, "é" * 129]  # fmt: skip
# Lengths around the bounds (256-byte ids, 1 KiB text), then far over them.
_LENGTHS: Final = [255, 256, 257, 1023, 1024, 1025, 4096, 65_536, 300_000]
_LENGTH_WEIGHTS: Final = [8, 8, 8, 6, 6, 6, 4, 2, 1]
TOKENS: Final = [0, 1, 2, 2**31, 2**63 - 1, 2**63, 2**64 - 1]
_VARINTS: Final = [0, 1, 2, 127, 128, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1,
                   2**63 - 1, 2**63, 2**64 - 1, -1, -2, -(2**31), -(2**63)]  # fmt: skip
_MS: Final = [-1, 0, 1, 5, 20, 100, 2**31, 2**63 - 1, -(2**63)]
_BACKENDS: Final = ["noop", "app_channel", "cuda", "direct_memory", "memory_regions", "nope"]
SERVICES: Final = ["", "snapshot_agent.v1alpha1.SnapshotAgentService", "noop", "cuda",
                    "app_channel", "grpc.health.v1.Health"]  # fmt: skip


def hostile_text(rng: random.Random) -> bytes:
    """A string field's bytes, chosen to break a careless reader."""
    pick = rng.randrange(10)
    if pick == 0:
        return b""
    if pick <= 2:
        size = rng.choices(_LENGTHS, _LENGTH_WEIGHTS)[0]
        return (rng.choice("ajé🙂") * size).encode()[: max(size, 1) * 2]
    if pick == 3:
        return rng.choice(_CONTROL).encode()
    if pick == 4:
        return rng.choice(_FORMAT).encode()
    if pick == 5:
        return rng.choice(_NOT_UTF8)
    if pick <= 7:
        return rng.choice(_ODD).encode()
    return bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 40)))


def _pooled_text(name: str, rng: random.Random, pools: Pools) -> str | None:
    """A value from the pools for a field of this name (None: the name has none)."""
    if name in ("job_id", "next_job_id", "released_job_id"):
        return rng.choice(pools.jobs)
    if name in ("group_id", "group", "more_group_ids", "groups"):
        return rng.choice(pools.groups)
    if name in ("node", "nodes", "node_name"):
        return rng.choice(pools.nodes)
    if name == "address":
        return rng.choice((pools.agent_address, "127.0.0.1:1"))
    if name == "operation_id":
        return str(pick(rng, pools.operations, "op-1"))
    if name == "lease_id":
        return str(pick(rng, [lease for _, lease in pools.grants.values()], "lease-1"))
    if name == "name":
        return rng.choice(_BACKENDS)
    if name == "service":
        return rng.choice(SERVICES)
    if name == "endpoints":
        return "http://127.0.0.1:1"
    if name == "tags":
        return rng.choice(("weights", "kv_cache"))
    return None


def _signed(value: int) -> int:
    return value & (2**64 - 1)


def varint(value: int) -> bytes:
    """`value` as a protobuf varint (negative numbers as 64-bit two's complement)."""
    value = _signed(value) if value < 0 else value
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


def _int_value(name: str, proto_type: str, rng: random.Random, pools: Pools) -> int:
    if name == "fencing_token" and rng.random() < 0.6:
        return pools.token(rng, rng.choice(pools.groups))
    if name.endswith("_ms") and rng.random() < 0.6:
        return rng.choice(_MS)
    if proto_type == "bool":
        return rng.choice((0, 1, 2, 2**64 - 1))
    if rng.random() < 0.3:
        return rng.randrange(-1000, 1000)
    return rng.choice(_VARINTS)


def _scalar(name: str, meta: Any, cls: Any, rng: random.Random, pools: Pools) -> bytes:
    """One value of a non-message field, with its key."""
    number, proto_type = meta.number, meta.proto_type
    if proto_type == "string":
        pooled = _pooled_text(name, rng, pools)
        data = pooled.encode() if pooled is not None and rng.random() < 0.5 else hostile_text(rng)
        return length_delimited(number, data)
    if proto_type == "bytes":
        return length_delimited(number, rng.randbytes(rng.randrange(64)))
    if proto_type == "enum":
        values = [int(v) for v in cls] if cls is not None else [0]
        value = rng.choice(values) if rng.random() < 0.7 else rng.choice((7, 999, -1, 2**31))
        return key(number, 0) + varint(value)
    if proto_type in ("fixed64", "sfixed64", "double"):
        special = struct.pack("<d", rng.choice((math.nan, math.inf, -0.0, 1e308)))
        return key(number, 1) + (special if rng.random() < 0.5 else rng.randbytes(8))
    if proto_type in ("fixed32", "sfixed32", "float"):
        return key(number, 5) + rng.randbytes(4)
    return key(number, 0) + varint(_int_value(name, proto_type, rng, pools))


def _timestamp(rng: random.Random) -> bytes:
    # google.protobuf.Timestamp: seconds (1), nanos (2), each possibly out of range.
    return key(1, 0) + varint(rng.choice(_VARINTS)) + key(2, 0) + varint(rng.choice(_VARINTS))


def _items(name: str, meta: Any, rng: random.Random) -> int:
    if not meta.repeated and meta.proto_type != "map":
        return 1
    if rng.random() < 0.04:  # at or just over a bound of `timeslice.api.bounds`
        limit = 4096 if name in ("pids", "regions", "jobs") else 256
        return limit + rng.choice((0, 1))
    return rng.choice((0, 1, 1, 2, 3, 8))


def _meta(cls: Any) -> Any:
    """The generated class's field table (number, wire type, oneof of each field)."""
    return cls._betterproto


def hostile_body(
    cls: type[betterproto2.Message], rng: random.Random, pools: Pools, depth: int = 0
) -> bytes:
    """A body for `cls` with hostile values: any field may be missing, any value odd,
    a oneof may carry two members, and unknown, repeated or mistyped fields may follow."""
    meta = _meta(cls)
    fields: list[bytes] = []
    oneofs: set[str] = set()
    for name, fmeta in meta.meta_by_field_name.items():
        if rng.random() < 0.35:
            continue
        if fmeta.group is not None:
            if fmeta.group in oneofs and rng.random() > 0.2:
                continue
            oneofs.add(fmeta.group)
        nested = meta.cls_by_field.get(name)
        count = _items(name, fmeta, rng)
        made = [_field(name, fmeta, nested, rng, pools, depth) for _ in range(min(count, 8))]
        if count > len(made):  # many items: the same small one over and over
            small = min(made, key=len)
            made = [small if len(small) <= 300 else _small(fmeta)] * count
        fields += made
    fields += _extras(meta, fields, rng)
    if rng.random() < 0.2:
        rng.shuffle(fields)
    return b"".join(fields)


def _field(
    name: str, fmeta: Any, nested: Any, rng: random.Random, pools: Pools, depth: int
) -> bytes:
    """One item of a field, with its key."""
    if fmeta.proto_type == "map":
        entry = length_delimited(1, hostile_text(rng)[:64])
        entry += length_delimited(2, hostile_text(rng)[:2048])
        return length_delimited(fmeta.number, entry)
    if fmeta.proto_type == "message":
        if hasattr(nested, "_betterproto") and depth < 4:
            return length_delimited(fmeta.number, hostile_body(nested, rng, pools, depth + 1))
        return length_delimited(fmeta.number, _timestamp(rng))
    return _scalar(name, fmeta, nested, rng, pools)


def one_hostile_field(
    cls: type[betterproto2.Message], rng: random.Random, pools: Pools, depth: int = 0
) -> bytes:
    """One field of `cls` with a hostile value, inside nested messages as deep as
    chance takes it: appended to a valid body it replaces that field's value (the
    last one wins), so that the request gets past every other check."""
    meta = _meta(cls)
    if not meta.meta_by_field_name:
        return b"".join(_extras(meta, [], rng)) or key(15, 0) + varint(1)
    name, fmeta = rng.choice(list(meta.meta_by_field_name.items()))
    nested: Any = meta.cls_by_field.get(name)
    if fmeta.proto_type == "message" and hasattr(nested, "_betterproto") and depth < 4:
        if rng.random() < 0.7:
            return length_delimited(fmeta.number, one_hostile_field(nested, rng, pools, depth + 1))
    return _field(name, fmeta, nested, rng, pools, depth)


def _small(fmeta: Any) -> bytes:
    """A short well-formed item of a field."""
    if fmeta.proto_type in ("string", "bytes", "message", "map"):
        return length_delimited(fmeta.number, b"")
    return key(fmeta.number, 0) + varint(1)


def _extras(meta: Any, fields: list[bytes], rng: random.Random) -> list[bytes]:
    extras: list[bytes] = []
    if rng.random() < 0.15:  # a field of a newer peer: to be skipped
        number = rng.choice((15, 99, 999, 2**29 - 1))
        wire = rng.choice((0, 1, 2, 5))
        payload = {0: varint(rng.choice(_VARINTS)), 1: rng.randbytes(8), 5: rng.randbytes(4)}
        extras.append(
            length_delimited(number, _deep(rng)) if wire == 2 else key(number, wire) + payload[wire]
        )
    if fields and rng.random() < 0.1:  # a field twice
        extras.append(rng.choice(fields))
    if meta.meta_by_field_name and rng.random() < 0.05:  # a known field of the wrong type
        fmeta = rng.choice(list(meta.meta_by_field_name.values()))
        extras.append(key(fmeta.number, 0) + varint(1) if fmeta.proto_type in ("string", "message")
                      else length_delimited(fmeta.number, b"xx"))  # fmt: skip
    if rng.random() < 0.02:  # what no encoder writes
        extras.append(rng.choice((key(0, 0) + b"\x01", key(1, 3), key(1, 4), key(2, 6),
                                  key(3, 7), b"\x8a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
                                  key(2**29 + 5, 0) + b"\x00")))  # fmt: skip
    return extras


def _deep(rng: random.Random) -> bytes:
    """Length-delimited fields nested in each other, up to a few hundred deep."""
    data = b"x"
    for _ in range(rng.choice((1, 3, 40, 300))):
        data = length_delimited(1, data)
    return data


def mutate(data: bytes, rng: random.Random) -> bytes:
    """`data` with a few random edits: bit flips, cuts, insertions, duplications."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif op == 2:
            del out[at:]
        elif op == 3:
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        elif op == 4:
            end = min(len(out), at + rng.randint(1, 16))
            out[at:at] = out[at:end]
        elif op == 5:
            del out[at : at + rng.randint(1, 8)]
        else:
            out += out[:at]
    return bytes(out[: 2 * MiB])


def frame(body: bytes, flag: int = 0, length: int | None = None) -> bytes:
    """One gRPC message: a flag byte, a 4-byte big-endian length, the body."""
    return bytes([flag]) + (len(body) if length is None else length).to_bytes(4, "big") + body
