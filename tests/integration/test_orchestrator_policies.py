"""Group policies over gRPC: the configured policy picks the next holder."""

from __future__ import annotations

import asyncio

import pytest

from timeslice import AsyncTimeSliceOrchestratorClient, InvalidArgumentError, Orchestrator


async def _serve_order(orch: Orchestrator, waiters: list[tuple[str, int]]) -> list[str]:
    """`holder` holds; each (job, priority) queues in turn; the grants' order."""
    order: list[str] = []
    clients = [
        AsyncTimeSliceOrchestratorClient(orch.address, job, "g", priority=priority)
        for job, priority in waiters
    ]
    holder = AsyncTimeSliceOrchestratorClient(orch.address, "holder", "g")
    async with holder:
        await holder.acquire()

        async def take(client: AsyncTimeSliceOrchestratorClient) -> None:
            async with client.acquire():
                order.append(client.job_id or "")

        tasks = []
        for client in clients:
            tasks.append(asyncio.ensure_future(take(client)))
            while len(orch.group("g").queue) < len(tasks):
                await asyncio.sleep(0.005)
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    for client in clients:
        await client.close()
    return order


async def test_the_priority_policy_serves_higher_priorities_first() -> None:
    async with Orchestrator(policy="priority", priority_aging=3600) as orch:
        order = await _serve_order(orch, [("low", 0), ("high", 9), ("mid", 5)])
    assert order == ["high", "mid", "low"]


async def test_fifo_ignores_priorities() -> None:
    async with Orchestrator() as orch:
        order = await _serve_order(orch, [("low", 0), ("high", 9), ("mid", 5)])
    assert order == ["low", "high", "mid"]


async def test_a_policy_per_group_and_a_journaled_policy_survive_a_restart(sqlite_url: str) -> None:
    async with Orchestrator(db=sqlite_url, policies={"g": "lrs"}) as orch:
        assert orch.table.policy("g")[0] == "lrs"
        assert orch.table.policy("other")[0] == "fifo"
    async with Orchestrator(db=sqlite_url, policies={"g": "lrs"}) as orch:
        assert orch.table.policy("g")[0] == "lrs"


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        Orchestrator(policy="random")
    with pytest.raises(InvalidArgumentError):
        Orchestrator(policies={"g": "lifo"})
