"""A hold limit with a grace period over gRPC: the holder is asked to yield (a Watch
event, a flag in its KeepAlive answers), then revoked if it does not."""

from __future__ import annotations

import asyncio
import time

from tests.waiting import until
from timeslice import AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.client import WatchEventKind


async def test_the_holder_is_asked_to_yield_then_revoked_after_the_grace() -> None:
    async with Orchestrator(hold_limit=0.4, hold_grace=0.6) as orch:
        holder = AsyncTimeSliceOrchestratorClient(orch.address, "a", "g", lease_ttl_sec=0.3)
        watcher = AsyncTimeSliceOrchestratorClient(orch.address, "w", "g")
        async with holder, watcher:
            start = time.monotonic()
            seen: list[tuple[WatchEventKind, float]] = []

            async def collect() -> None:
                async for event in watcher.watch("g"):
                    seen.append((event.kind, time.monotonic() - start))
                    if event.kind is WatchEventKind.REVOKED:
                        return

            collecting = asyncio.ensure_future(collect())
            # The watch is open before anything happens.
            await until(lambda: orch.watches.count == 1, "the watch is open")
            await holder.acquire()
            await asyncio.wait_for(collecting, 5)
            kinds = [kind for kind, _ in seen]
            assert kinds == [WatchEventKind.GRANTED, WatchEventKind.YIELD_REQUESTED,
                             WatchEventKind.REVOKED], seen  # fmt: skip
            asked, revoked = seen[1][1], seen[2][1]
            assert 0.35 <= asked < 0.9 and 0.95 <= revoked < 1.6, seen
            assert holder.yield_requested() or holder.lease_lost()


async def test_a_holder_that_yields_when_asked_keeps_nothing_revoked() -> None:
    async with Orchestrator(hold_limit=0.3, hold_grace=5.0) as orch:
        holder = AsyncTimeSliceOrchestratorClient(orch.address, "a", "g", lease_ttl_sec=0.15)
        async with holder:
            await holder.acquire()
            deadline = time.monotonic() + 3
            while not holder.yield_requested():
                assert time.monotonic() < deadline, "no yield request arrived"
                await asyncio.sleep(0.02)
            result = await holder.release()  # not LeaseLostError: it was not revoked
            assert result.success
