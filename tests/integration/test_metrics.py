"""Metrics through the real services: an in-process orchestrator and an agent in
session with it (noop backend), their `/metrics` scraped over HTTP before and
after two switches and parsed with prometheus-client's parser; each metric moves
by what happened between the scrapes, and no more."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from tests.metrics_scrape import Samples, delta, scrape, value
from tests.ports import free_port
from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.client import AsyncTimeSliceOrchestratorClient, named_backend
from timeslice.orchestrator.server import Orchestrator

pytestmark = pytest.mark.timeout(30)

G = {"group_id": "g"}


@pytest.fixture(autouse=True)
def render_every_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each scrape here sees the metrics as they are now (the servers render at most
    once a second otherwise)."""
    monkeypatch.setattr("timeslice.metrics.http.MIN_RENDER_INTERVAL", 0.0)


@asynccontextmanager
async def cluster() -> AsyncIterator[
    tuple[Orchestrator, Agent, dict[str, AsyncTimeSliceOrchestratorClient]]
]:
    """An orchestrator and an agent "n1" in session, group g on n1, jobs a and b
    registered with the noop backend, each with a client."""
    async with AsyncExitStack() as stack:
        orch = await stack.enter_async_context(Orchestrator(metrics_port=free_port()))
        agent = await stack.enter_async_context(
            Agent(
                node_name="n1",
                backends=("noop",),
                orchestrator=orch.address,
                groups=("g",),
                metrics_port=free_port(),
            )
        )
        await until(
            lambda: "n1" in orch.table.nodes.get("g", ()) and "n1" in orch.agents.addresses,
            "the agent joined g",
        )
        clients = {}
        for job in ("a", "b"):
            client = AsyncTimeSliceOrchestratorClient(orch.address, job, "g", lease_ttl_sec=None)
            clients[job] = await stack.enter_async_context(client)
            await client.register_job(named_backend("noop"), job_id=job, group_id="g")
        yield orch, agent, clients


async def hand_over(
    clients: dict[str, AsyncTimeSliceOrchestratorClient], holder: str, waiter: str
) -> None:
    """`waiter` queues, `holder` yields, and `waiter` is granted (after a switch)."""
    call = asyncio.ensure_future(clients[waiter].acquire())
    while waiter not in (await clients[holder].get_status()).group.waiting_jobs:
        assert not call.done(), call
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)  # a queue wait worth measuring
    await clients[holder].release()
    await call


def count(samples: Samples, name: str, labels: dict[str, str]) -> float:
    return value(samples, f"{name}_count", labels)


async def test_two_switches_move_every_metric_by_what_happened() -> None:
    async with cluster() as (orch, agent, clients):
        assert orch.metrics_address and agent.metrics_address
        await clients["a"].acquire()  # a's context becomes the live one
        await asyncio.sleep(0.05)
        o0, a0 = await scrape(orch.metrics_address), await scrape(agent.metrics_address)
        t0 = time.monotonic()

        await hand_over(clients, "a", "b")  # switch 1: a snapshotted, b restored
        await hand_over(clients, "b", "a")  # switch 2: b snapshotted, a restored
        await clients["a"].release()  # nobody waits: a's context stays (deferred)

        o1, a1 = await scrape(orch.metrics_address), await scrape(agent.metrics_address)
        elapsed = time.monotonic() - t0

    # The v1alpha1 system's four.
    assert value(o1, "timeslice_orchestrator_queue_depth", G) == 0
    assert delta(o0, o1, "timeslice_orchestrator_acquire_wait_duration_seconds_count", G) == 2
    waited = delta(o0, o1, "timeslice_orchestrator_acquire_wait_duration_seconds_sum", G)
    assert 0.1 <= waited < elapsed
    ops = "timeslice_orchestrator_agent_operation_duration_seconds_count"
    for job in "ab":  # each saved once, restored once
        for operation in ("snapshot", "restore"):
            labels = {**G, "job_id": job, "node": "n1", "operation": operation}
            assert delta(o0, o1, ops, labels) == 1, (job, operation)
    assert delta(o0, o1, "timeslice_orchestrator_deferred_snapshots_total", G) == 1

    # Ours: switches and their parts.
    ok = {**G, "outcome": "ok"}
    assert delta(o0, o1, "timeslice_switch_duration_seconds_count", ok) == 2
    assert delta(o0, o1, "timeslice_switch_duration_seconds_count", {**G, "outcome": "failed"}) == 0
    switched = delta(o0, o1, "timeslice_switch_duration_seconds_sum", ok)
    assert 0 < switched < elapsed
    parts = 0.0
    for phase in ("snapshot", "restore", "overhead"):
        labels = {**G, "phase": phase}
        assert delta(o0, o1, "timeslice_switch_phase_duration_seconds_count", labels) == 2
        parts += delta(o0, o1, "timeslice_switch_phase_duration_seconds_sum", labels)
    assert parts == pytest.approx(switched, abs=1e-6)  # the parts add up to the switch
    queued = delta(
        o0, o1, "timeslice_switch_phase_duration_seconds_sum", {**G, "phase": "queue_wait"}
    )
    assert queued + switched == pytest.approx(waited, abs=1e-6)
    assert queued >= 0.1  # each waiter queued 50 ms or more before the yield

    # Grants, yields, revocations, bytes, the journal, agents.
    assert delta(o0, o1, "timeslice_grants_total", {**G, "context": "restored"}) == 2
    assert delta(o0, o1, "timeslice_grants_total", {**G, "context": "live"}) == 0
    assert delta(o0, o1, "timeslice_yields_total", G) == 3
    assert not any(name == "timeslice_revocations_total" for name, _ in o1)
    for operation in ("snapshot", "restore"):
        labels = {**G, "operation": operation}
        assert delta(o0, o1, "timeslice_switch_moved_bytes_total", labels) == 0  # noop
    # Acquire b, Yield a, SwitchDone; Acquire a, Yield b, SwitchDone; Yield a.
    assert delta(o0, o1, "timeslice_journal_events_total") == 7
    assert 1 <= delta(o0, o1, "timeslice_journal_commit_duration_seconds_count") <= 7
    assert value(o1, "timeslice_agents_connected") == 1

    # Busy share and the per-job seconds.
    busy = delta(o0, o1, "timeslice_group_busy_seconds_total", G)
    held = {
        job: delta(o0, o1, "timeslice_job_held_seconds_total", {**G, "job_id": job}) for job in "ab"
    }
    assert 0.1 < busy < elapsed
    assert held["a"] > 0 and held["b"] > 0
    assert sum(held.values()) == pytest.approx(busy, abs=1e-6)
    assert busy + switched < elapsed
    switching = [
        delta(o0, o1, "timeslice_job_switching_seconds_total", {**G, "job_id": job}) for job in "ab"
    ]
    assert sum(switching) == pytest.approx(switched, abs=1e-6) and min(switching) > 0
    waited_jobs = sum(
        delta(o0, o1, "timeslice_job_waited_seconds_total", {**G, "job_id": job}) for job in "ab"
    )
    assert waited_jobs == pytest.approx(queued, abs=1e-6)

    # The agent: its operations by backend, kind and outcome; jobs by state.
    for kind, n in (("snapshot", 2), ("restore", 2)):
        labels = {"backend": "noop", "kind": kind, "outcome": "complete"}
        assert delta(a0, a1, "timeslice_agent_operations_total", labels) == n
        assert delta(a0, a1, "timeslice_agent_operation_duration_seconds_count", labels) == n
        assert delta(a0, a1, "timeslice_agent_moved_bytes_total", labels) == 0
        failed = {**labels, "outcome": "failed"}
        assert delta(a0, a1, "timeslice_agent_operations_total", failed) == 0
    assert value(a1, "timeslice_agent_jobs", {"state": "RUNNING"}) == 1  # a
    assert value(a1, "timeslice_agent_jobs", {"state": "SAVED"}) == 1  # b
    assert value(a1, "timeslice_agent_jobs", {"state": "FAULTED"}) == 0
    assert value(a1, "timeslice_agent_workload_channels_open") == 0


async def test_metrics_are_off_by_default_and_each_server_has_its_own() -> None:
    async with Orchestrator() as plain:
        assert plain.metrics is None and plain.metrics_address is None
        assert plain.engine is not None and plain.engine.committed is None
        assert not any(
            getattr(o, "__self__", None).__class__.__name__ == "OrchestratorMetrics"
            for o in plain.engine.observers
        )
    async with (
        Orchestrator(metrics_port=free_port()) as one,
        Orchestrator(metrics_port=free_port()) as two,
    ):
        assert one.metrics and two.metrics and one.metrics.registry is not two.metrics.registry
        async with AsyncTimeSliceOrchestratorClient(one.address, "j", "g") as client:
            await client.acquire()
        assert one.metrics_address and two.metrics_address
        first, second = await scrape(one.metrics_address), await scrape(two.metrics_address)
        assert value(first, "timeslice_grants_total", {**G, "context": "live"}) == 1
        assert value(second, "timeslice_grants_total", {**G, "context": "live"}) == 0
