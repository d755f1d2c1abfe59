"""The two lock services `anchors.py` measures ours against, as clients: etcd's
v3lock gRPC service and a Redis list used as a lock; and ours called the way
etcd is (`OurWireLock`), so that the two servers meet behind the same client.

etcd is called through grpclib, the client stack ours is called through, over
the same channels (`common.channel`). grpclib's default codec asks a message for
`SerializeToString()` and a message type for `FromString(data)`, so `Wire` (a
message that is its encoded bytes) lets it carry bytes that the few functions
below encode and decode: only the fields the lock needs, with the field numbers
of etcd's published protos (`v3lockpb/v3lock.proto`, `etcdserverpb/rpc.proto`):

  LockRequest{name bytes = 1, lease int64 = 2}   LockResponse{header = 1, key bytes = 2}
  UnlockRequest{key bytes = 1}                   UnlockResponse{header = 1}
  LeaseGrantRequest{TTL int64 = 1, ID int64 = 2}
  LeaseGrantResponse{header = 1, ID int64 = 2, TTL int64 = 3, error string = 4}
  RangeRequest{key bytes = 1, range_end bytes = 2, count_only bool = 9}
  RangeResponse{header = 1, kvs = 2, more = 3, count int64 = 4}

and ours the same way, with the field numbers of our own protos
(`timeslice/api/proto/timeslice_orchestrator/v1alpha1/orchestrator.proto`):

  AcquireRequest{job_id = 1, group_id = 2}    AcquireResponse{success = 1, fencing_token = 101}
  YieldRequest{job_id = 1, group_id = 2, fencing_token = 101}   YieldResponse{success = 1}
  GetGroupStatusRequest{group_id = 1}
  GetGroupStatusResponse{group = 1}           GroupStatus{locking_job = 4, waiting_jobs = 101}

Redis is called through the `redis` package (redis.asyncio, a test extra): the
client most Python programs use, kept up to date with the server's protocol, so
that its figures are Redis's and not those of a client of our own. A lock is a
list holding one token: acquiring is `BLPOP` (a waiter blocks in the server's
queue for the key, served first come, first served), releasing is `LPUSH`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import AsyncIterator
from typing import Any, Self

import grpclib.const
from grpclib.client import Channel

from benchmarks.common import CALL_TIMEOUT

LOCK = "/v3lockpb.Lock/Lock"
UNLOCK = "/v3lockpb.Lock/Unlock"
LEASE_GRANT = "/etcdserverpb.Lease/LeaseGrant"
RANGE = "/etcdserverpb.KV/Range"
LEASE_TTL = 3600  # seconds: no keepalive is needed while a benchmark runs

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
Fields = dict[int, list[int | bytes]]

# --- protocol buffers: just what the lock needs ---------------------------------------------


def varint(value: int) -> bytes:
    """`value` as a base-128 varint; a negative int64 takes its 64-bit two's complement."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number: int, value: int | bytes) -> bytes:
    """One field: an int as a varint, bytes length-delimited; proto3 leaves out a
    field at its default (0, empty)."""
    if not value:
        return b""
    if isinstance(value, bytes):
        return varint(number << 3 | LENGTH) + varint(len(value)) + value
    return varint(number << 3 | VARINT) + varint(value)


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at `data[at:]` and where it ends."""
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a varint runs past the end of the message")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def decode(data: bytes) -> Fields:
    """Every field of a message by number: varints as ints, length-delimited as
    bytes (fixed-width fields as their bytes)."""
    fields: Fields = {}
    at = 0
    while at < len(data):
        key, at = read_varint(data, at)
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == VARINT:
            value, at = read_varint(data, at)
        elif kind == LENGTH:
            size, at = read_varint(data, at)
            value, at = data[at : at + size], at + size
        elif kind in (FIXED64, FIXED32):
            size = 8 if kind == FIXED64 else 4
            value, at = data[at : at + size], at + size
        else:
            raise ValueError(f"wire type {kind} is not supported")
        if at > len(data):
            raise ValueError("a field runs past the end of the message")
        fields.setdefault(number, []).append(value)
    return fields


def int64(fields: Fields, number: int) -> int:
    """Field `number` as an int64 (0 when absent; the last one wins)."""
    value = fields.get(number, [0])[-1]
    assert isinstance(value, int), f"field {number} is not a varint"
    return value - (1 << 64) if value >= 1 << 63 else value


def blob(fields: Fields, number: int) -> bytes:
    """Field `number` as bytes (empty when absent)."""
    value = fields.get(number, [b""])[-1]
    assert isinstance(value, bytes), f"field {number} is not length-delimited"
    return value


def lock_request(name: bytes, lease: int) -> bytes:
    return field(1, name) + field(2, lease)


def unlock_request(key: bytes) -> bytes:
    return field(1, key)


def lease_grant_request(ttl: int, lease: int = 0) -> bytes:
    return field(1, ttl) + field(2, lease)


def count_request(prefix: bytes) -> bytes:
    """A Range that counts the keys starting with `prefix`."""
    end = prefix[:-1] + bytes([prefix[-1] + 1])  # the first key past the prefix
    return field(1, prefix) + field(2, end) + field(9, 1)


def granted_lease(data: bytes) -> int:
    """The lease ID of a LeaseGrantResponse; its error, if any, raised."""
    fields = decode(data)
    if error := blob(fields, 4):
        raise RuntimeError(f"LeaseGrant: {error.decode()}")
    return int64(fields, 2)


# --- etcd ---------------------------------------------------------------------------------


class Wire:
    """A message as its encoded bytes, for grpclib's codec."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 (the name grpclib's codec calls)
        return self.data

    @classmethod
    def FromString(cls, data: bytes) -> Self:  # noqa: N802
        return cls(data)


async def call(channel: Channel, method: str, request: bytes) -> bytes:
    """One unary call of `method` with an encoded request; the encoded reply."""
    async with channel.request(
        method, grpclib.const.Cardinality.UNARY_UNARY, Wire, Wire, timeout=CALL_TIMEOUT
    ) as stream:
        await stream.send_message(Wire(request), end=True)
        reply = await stream.recv_message()
    assert reply is not None
    return reply.data


class EtcdLock:
    """etcd's lock `name`, held through a lease of its own (granted on the first
    acquire); the calls go over `channel`, which other locks may share."""

    def __init__(self, channel: Channel, name: str) -> None:
        self.channel, self.name = channel, name.encode()
        self.lease = 0
        self.key = b""  # while held: the key etcd made for this holder

    async def acquire(self) -> None:
        """Block until the lock is ours."""
        if not self.lease:
            self.lease = granted_lease(
                await call(self.channel, LEASE_GRANT, lease_grant_request(LEASE_TTL))
            )
        reply = await call(self.channel, LOCK, lock_request(self.name, self.lease))
        self.key = blob(decode(reply), 2)

    async def release(self) -> None:
        await call(self.channel, UNLOCK, unlock_request(self.key))
        self.key = b""

    async def contenders(self) -> int:
        """Holders and waiters: etcd keeps one key per contender under `name/`."""
        reply = await call(self.channel, RANGE, count_request(self.name + b"/"))
        return int64(decode(reply), 4)


# --- ours, called as etcd is ------------------------------------------------------------

OUR_SERVICE = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/"
_OUR_JOBS = itertools.count()


def our_job_id() -> str:
    """A job id no other lock of ours uses, in this process or another."""
    return f"job-{os.getpid()}-{next(_OUR_JOBS)}"


def job_request(job: bytes, group: bytes, fencing_token: int = 0) -> bytes:
    """An AcquireRequest, or a YieldRequest (the same first two fields; a Yield may
    carry the grant's fencing token)."""
    return field(1, job) + field(2, group) + field(101, fencing_token)


def granted_token(data: bytes, what: str) -> int:
    """The fencing token of an AcquireResponse or YieldResponse (0 for a Yield);
    one without success raised."""
    fields = decode(data)
    if not int64(fields, 1):
        raise RuntimeError(f"{what} answered without success")
    return int64(fields, 101)


def contenders_of(data: bytes) -> int:
    """The holder and the queued jobs a GetGroupStatusResponse lists."""
    group = decode(blob(decode(data), 1))
    return bool(blob(group, 4)) + len(group.get(101, []))


class OurWireLock:
    """Our group `name` as a lock, called as `EtcdLock` calls etcd: through grpclib
    over `channel` (which other locks may share), each message encoded and read
    by hand, only the fields a lock needs. Each lock is a job of its own; its
    release is a Yield with the fencing token its grant returned, as etcd's
    Unlock carries the key its Lock returned. No lease."""

    def __init__(self, channel: Channel, name: str) -> None:
        self.channel, self.group = channel, name.encode()
        self.job = our_job_id().encode()
        self.token = 0  # while held: the fencing token of this holder's grant

    async def acquire(self) -> None:
        """Block until the group is ours."""
        reply = await call(self.channel, OUR_SERVICE + "Acquire", job_request(self.job, self.group))
        self.token = granted_token(reply, "Acquire")

    async def release(self) -> None:
        request = job_request(self.job, self.group, self.token)
        granted_token(await call(self.channel, OUR_SERVICE + "Yield", request), "Yield")
        self.token = 0

    async def contenders(self) -> int:
        """The holder and the jobs queued, as the group's status lists them."""
        reply = await call(self.channel, OUR_SERVICE + "GetGroupStatus", field(1, self.group))
        return contenders_of(reply)


# --- Redis --------------------------------------------------------------------------------


def redis_client(address: str) -> Any:
    """A Redis client on one connection of its own (a blocked BLPOP holds its
    connection: two locks cannot share one). No socket timeout: the client then
    sends through `asyncio.wait_for`, which on Python 3.11 can swallow the
    cancellation of a job stopped as its send completes (the job then blocks in
    its next BLPOP for ever); the callers bound their waits themselves."""
    import redis.asyncio

    host, port = address.rsplit(":", 1)
    return redis.asyncio.Redis(
        host=host, port=int(port), single_connection_client=True, socket_timeout=None
    )


@contextlib.asynccontextmanager
async def redis_connection(address: str) -> AsyncIterator[Any]:
    """`redis_client(address)`, closed on leaving."""
    client = redis_client(address)
    try:
        yield client
    finally:
        await client.aclose()


class RedisLock:
    """A Redis list `lock:NAME` holding one token is the lock `NAME`; `client`'s
    connection is this lock's alone."""

    def __init__(self, client: Any, name: str) -> None:
        self.client, self.key = client, f"lock:{name}"

    async def create(self) -> None:
        """Put the token in (once per lock, before anyone acquires it)."""
        await self.client.delete(self.key)
        await self.client.lpush(self.key, "token")

    async def acquire(self) -> None:
        """Block until the token is ours (`BLPOP` with no timeout)."""
        await self.client.blpop([self.key], 0)

    async def release(self) -> None:
        await self.client.lpush(self.key, "token")

    async def blocked(self) -> int:
        """Clients blocked in the server (on any key)."""
        info = await self.client.info("clients")
        return int(info["blocked_clients"])
