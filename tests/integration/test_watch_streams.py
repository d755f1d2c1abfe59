"""Watch streams over gRPC on 127.0.0.1: each event is encoded once, whatever the
number of streams that send it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

from grpclib.const import Cardinality
from orchestrator_wire import SERVICE, orchestrator_stub

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.orchestrator.server import Orchestrator


@contextmanager
def counting_encodings() -> Iterator[list[pb.WatchEvent]]:
    """Every WatchEvent encoded while the block runs."""
    encoded: list[pb.WatchEvent] = []
    original = pb.WatchEvent.__bytes__

    def encode(self: pb.WatchEvent) -> bytes:
        encoded.append(self)
        return original(self)

    pb.WatchEvent.__bytes__ = encode  # type: ignore[method-assign]
    try:
        yield encoded
    finally:
        pb.WatchEvent.__bytes__ = original  # type: ignore[method-assign]


async def test_an_event_is_encoded_once_for_200_watch_streams() -> None:
    streams = 200
    async with (
        Orchestrator(max_streams_per_connection=64, max_watchers=streams) as orch,
        AsyncExitStack() as stack,
    ):
        stubs = [await stack.enter_async_context(orchestrator_stub(orch.address)) for _ in range(4)]
        watching = []
        for i in range(streams):
            request = stubs[i % 4].channel.request(
                f"{SERVICE}/Watch", Cardinality.UNARY_STREAM, pb.WatchRequest, pb.WatchEvent
            )
            stream = await stack.enter_async_context(request)
            await stream.send_message(pb.WatchRequest(), end=True)
            watching.append(stream)
        async with asyncio.timeout(10):
            while orch.watches.count < streams:
                await asyncio.sleep(0.01)
        with counting_encodings() as encoded:
            await stubs[0].acquire(pb.AcquireRequest(group_id="g", job_id="a"))
            await stubs[0].yield_(pb.YieldRequest(group_id="g", job_id="a"))
            got = [[await stream.recv_message() for _ in range(2)] for stream in watching]
        kinds = [(e.kind, e.job_id) for e in got[0]]
        assert kinds == [(pb.WatchEventKind.GRANTED, "a"), (pb.WatchEventKind.YIELDED, "a")]
        assert all(events == got[0] for events in got)
        assert len(encoded) == 2  # one per event, not one per event and stream
        for stream in watching:
            await stream.cancel()
