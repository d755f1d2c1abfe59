"""Atomic acquire of several groups: all or nothing, and no deadlock whatever order
jobs ask in. Over real gRPC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.waiting import until
from timeslice import AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.errors import ConflictError, DeadlineExceededError

GROUPS = ("sampler", "trainer")


def waits(orch: Orchestrator, job: str, group: str) -> bool:
    """Whether `job` is in the queue of `group`."""
    g = orch.table.groups.get(group)
    return g is not None and job in g.queue


async def test_three_jobs_over_two_groups_in_random_orders_never_deadlock() -> None:
    rng = random.Random(11)
    holders: dict[str, str] = {}
    rounds = 0
    bundles = 0

    async with Orchestrator() as orch:

        async def job(name: str) -> None:
            nonlocal rounds, bundles
            async with AsyncTimeSliceOrchestratorClient(orch.address, job_id=name) as client:
                while rounds < 1000:
                    rounds += 1
                    choice = rng.choice(["both", "both-reversed", "sampler", "trainer"])
                    wanted = {
                        "both": list(GROUPS),
                        "both-reversed": list(reversed(GROUPS)),
                        "sampler": ["sampler"],
                        "trainer": ["trainer"],
                    }[choice]
                    async with client.acquire_groups(wanted) as grant:
                        for group in wanted:
                            assert group not in holders, (group, holders, name)
                            holders[group] = name
                        if len(wanted) > 1:
                            bundles += 1
                            assert {g.group_id for g in grant.grants} == set(wanted)
                            assert grant.grants[0].group_id == wanted[0]
                        await asyncio.sleep(rng.random() * 0.001)
                        for group in wanted:
                            del holders[group]

        await asyncio.wait_for(asyncio.gather(*(job(n) for n in ("a", "b", "c"))), 90)
        for group in GROUPS:
            assert orch.table.groups[group].holder is None
            assert not orch.table.groups[group].queue
        orch.table.validate()
    assert rounds >= 1000
    assert bundles > 300


async def test_a_bundle_is_granted_only_when_every_group_is_free() -> None:
    async with Orchestrator() as orch, AsyncTimeSliceOrchestratorClient(orch.address) as c:
        await c.acquire("single", "sampler")
        bundle = asyncio.ensure_future(c.acquire_groups(["trainer", "sampler"], "both"))
        await until(lambda: waits(orch, "both", "trainer"), "the bundle waits")
        # trainer is free, but it is kept for the bundle: nobody else takes it, and
        # the bundle holds nothing while it waits.
        assert not bundle.done()
        assert orch.table.groups["trainer"].holder is None
        late = asyncio.ensure_future(c.acquire("late", "trainer"))
        await until(lambda: waits(orch, "late", "trainer"), "late waits")
        assert not late.done()
        await c.release("single", "sampler")
        grant = await asyncio.wait_for(bundle, 5)
        assert [g.group_id for g in grant.grants] == ["trainer", "sampler"]
        assert {orch.table.groups[g].holder.job for g in GROUPS} == {"both"}  # type: ignore[union-attr]
        await c.release("both", "sampler")
        assert not late.done()  # trainer is still the bundle's
        await c.release("both", "trainer")
        await asyncio.wait_for(late, 5)
        await c.release("late", "trainer")


async def test_a_bundle_that_times_out_or_is_cancelled_leaves_every_queue() -> None:
    async with Orchestrator() as orch, AsyncTimeSliceOrchestratorClient(orch.address) as c:
        await c.acquire("holder", "sampler")
        with pytest.raises(DeadlineExceededError):
            await c.acquire_groups(GROUPS, "both", timeout_sec=0.2)
        for group in GROUPS:
            assert "both" not in orch.table.groups[group].queue
        waiting = asyncio.ensure_future(c.acquire_groups(GROUPS, "both"))
        await until(lambda: waits(orch, "both", "trainer"), "the bundle waits")
        assert "both" in orch.table.groups["trainer"].queue
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        for _ in range(100):
            if "both" not in orch.table.groups["trainer"].queue:
                break
            await asyncio.sleep(0.01)
        assert all("both" not in orch.table.groups[g].queue for g in GROUPS)
        # trainer, no longer kept for anyone, is granted at once
        result = await asyncio.wait_for(c.acquire("other", "trainer"), 2)
        assert result.success
        orch.table.validate()


async def test_holding_one_group_and_asking_for_both_is_refused() -> None:
    async with Orchestrator() as orch, AsyncTimeSliceOrchestratorClient(orch.address) as c:
        await c.acquire("j", "sampler")
        with pytest.raises(ConflictError, match="release those first"):
            await c.acquire_groups(GROUPS, "j")
        assert orch.table.groups["sampler"].holder.job == "j"  # type: ignore[union-attr]
        assert "trainer" not in orch.table.groups or not orch.table.groups["trainer"].queue


async def test_a_bundle_on_groups_with_nodes_is_answered_once_every_switch_is_done() -> None:
    from timeslice import Agent
    from timeslice.client import named_backend

    nodes = {"sampler": ("n-sampler",), "trainer": ("n-trainer",)}
    async with Orchestrator(group_nodes=nodes) as orch:
        agents = [
            Agent(node_name=node, backends=("noop",), orchestrator=orch.address)
            for (node,) in nodes.values()
        ]
        async with agents[0], agents[1], AsyncTimeSliceOrchestratorClient(orch.address) as c:
            for job in ("both", "other"):
                for group in GROUPS:
                    await c.register_job(named_backend("noop"), job_id=job, group_id=group)
            await c.acquire_groups(GROUPS, "other")
            await c.release("other", "sampler")
            await c.release("other", "trainer")
            grant = await asyncio.wait_for(c.acquire_groups(GROUPS, "both"), 10)
            # both groups switched from "other" to "both": each restored "both" (saved by
            # the first grant, which moved every other live context out)
            assert [(g.group_id, g.context_restored) for g in grant.grants] == [
                ("sampler", True),
                ("trainer", True),
            ]
            for agent, group in zip(agents, GROUPS, strict=True):
                states = {job: j.state.value for (_, job), j in agent.table.jobs.items()}
                assert states == {"both": "RUNNING", "other": "SAVED"}, group
            orch.table.validate()
