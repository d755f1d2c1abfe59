"""Helpers for tests that talk to an Orchestrator over real gRPC with the
generated grpclib stub (not the timeslice client), including raw request bytes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpclib.client
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

SERVICE = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService"
# Every call made through these helpers ends within this many seconds.
CALL_TIMEOUT = 10.0


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@asynccontextmanager
async def orchestrator_stub(
    address: str, timeout: float = CALL_TIMEOUT
) -> AsyncIterator[pb.TimeSliceOrchestratorServiceStub]:
    """A generated stub on its own channel, closed on exit."""
    host, port = split_address(address)
    channel = grpclib.client.Channel(host, port)
    try:
        yield pb.TimeSliceOrchestratorServiceStub(channel, timeout=timeout)
    finally:
        channel.close()


async def status_of(stub: pb.TimeSliceOrchestratorServiceStub, group: str) -> pb.GroupStatus:
    return (await stub.get_group_status(pb.GetGroupStatusRequest(group_id=group))).group


async def wait_for_status(
    stub: pb.TimeSliceOrchestratorServiceStub,
    group: str,
    check: Callable[[pb.GroupStatus], bool],
    timeout: float = 5.0,
    interval: float = 0.01,
) -> pb.GroupStatus:
    """Poll the group's status until `check` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = await status_of(stub, group)
        except GRPCError as exc:
            if exc.status is not Status.NOT_FOUND:
                raise
        else:
            if check(status):
                return status
        if time.monotonic() > deadline:
            raise AssertionError(f"group {group} never reached the expected state")
        await asyncio.sleep(interval)


async def wait_queued(
    stub: pb.TimeSliceOrchestratorServiceStub,
    group: str,
    jobs: list[str],
    timeout: float = 5.0,
    interval: float = 0.01,
) -> pb.GroupStatus:
    """Wait until exactly `jobs`, in this order, are queued on `group`."""

    def queued(status: pb.GroupStatus) -> bool:
        return list(status.waiting_jobs) == jobs

    return await wait_for_status(stub, group, queued, timeout, interval)


async def grpc_status(call: Awaitable[Any]) -> Status:
    """The status a call fails with (AssertionError if it succeeds)."""
    try:
        answer = await call
    except GRPCError as exc:
        return exc.status
    raise AssertionError(f"the call succeeded: {answer!r}")


class PassThroughCodec(CodecBase):
    """Sends and receives message bytes as they are, so tests can send any bytes."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


async def call_raw(
    address: str, method: str, payload: bytes, timeout: float = CALL_TIMEOUT
) -> bytes:
    """Send `payload` as the request body of unary `method`; return the raw answer.

    The request is sent while the answer is read, so that a server that refuses
    a large request before reading it all answers instead of stalling the sender.
    """
    host, port = split_address(address)
    channel = grpclib.client.Channel(host, port, codec=PassThroughCodec())
    try:
        async with channel.request(
            f"{SERVICE}/{method}", Cardinality.UNARY_UNARY, bytes, bytes, timeout=timeout
        ) as stream:
            await stream.send_request()
            sending = asyncio.ensure_future(stream.send_message(payload, end=True))
            try:
                answer = await stream.recv_message()
            finally:
                if not sending.done():
                    sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
        assert answer is not None
        return answer
    finally:
        channel.close()
