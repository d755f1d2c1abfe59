"""Pipelined switches: the next holder's context comes back tag by tag while the
outgoing one leaves, each tag once the outgoing steps have freed room for it.

The workloads here stand for two jobs' accelerator memory: each tag has a size,
and moving a tag takes `STEP` seconds. Each logs, as it happens, the bytes every
snapshot step frees and the bytes every restore step is about to fill, so that
the tests can replay the ledger: until the outgoing snapshot has ended, what
came in never exceeds what had gone out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from agent_wire import OpStatus, registered

from timeslice.agent.server import Agent
from timeslice.client import AsyncSnapshotAgentClient

pytestmark = pytest.mark.timeout(30)

STEP = 0.15  # seconds a tag takes to move
SWITCH_TIMEOUT = 10.0
COMPLETE, FAILED = OpStatus.COMPLETE, OpStatus.FAILED


@dataclass
class Entry:
    job: str
    # "freed" (a snapshot step ended), "failed" (one failed), "fill" (a restore step starts)
    what: str
    tags: tuple[str, ...]
    nbytes: int


@dataclass
class Tagged:
    """A workload of tags of given sizes that moves them one command at a time."""

    name: str
    sizes: dict[str, int]
    log: list[Entry]
    pipelined: bool = True
    fail_on: str = ""  # a tag whose snapshot fails
    step: float = STEP  # seconds a tag takes to move
    silent: bool = False  # says it moved nothing, whatever it moved
    out: set[str] = field(default_factory=set)

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(self.sizes)

    @property
    def state(self) -> str:
        return "SAVED" if self.out else "RUNNING"

    async def snapshot(self, mode: str, tags: list[str]) -> tuple[int, int]:
        chosen = [t for t in (tags or self.tags) if t not in self.out]
        freed = 0
        for tag in chosen:
            await asyncio.sleep(self.step)
            if tag == self.fail_on:
                self.log.append(Entry(self.name, "failed", tuple(tags), freed))
                raise RuntimeError(f"cannot move {tag}")
            self.out.add(tag)
            freed += self.sizes[tag]
        self.log.append(Entry(self.name, "freed", tuple(tags), freed))
        return (0, 0) if self.silent else (freed, freed)

    async def restore(self, tags: list[str]) -> tuple[int, int]:
        chosen = [t for t in (tags or self.tags) if t in self.out]
        filled = sum(self.sizes[t] for t in chosen)
        self.log.append(Entry(self.name, "fill", tuple(tags), filled))
        for tag in chosen:
            await asyncio.sleep(self.step)
            self.out.discard(tag)
        return filled, filled


@pytest.fixture
async def client(agent: Agent) -> AsyncIterator[AsyncSnapshotAgentClient]:
    async with AsyncSnapshotAgentClient(agent.address, call_timeout_sec=10) as running:
        yield running


def overdrawn(log: list[Entry], out: str, into: str) -> list[tuple[int, int]]:
    """Each restore step of `into` that started before `out`'s snapshot had ended
    (its last entry: its last step, or its failure), whose bytes with the steps
    before it exceeded what `out` had freed by then: (filled, freed)."""
    last = max(i for i, e in enumerate(log) if e.job == out)
    freed = filled = 0
    bad = []
    for entry in log[:last]:
        if entry.job == out:
            freed += entry.nbytes
        elif entry.job == into and entry.what == "fill":
            filled += entry.nbytes
            if filled > freed:
                bad.append((filled, freed))
    return bad


def order(log: list[Entry]) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(e.job, e.what, e.tags) for e in log]


async def switch(client: AsyncSnapshotAgentClient, to: str, token: int) -> Any:
    return await client.switch_group("g", to, token, timeout_sec=SWITCH_TIMEOUT)


async def test_the_restore_comes_in_tag_by_tag_as_the_snapshot_frees_room(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    log: list[Entry] = []
    a = Tagged("a", {"w": 40, "o": 30, "g": 30}, log)
    b = Tagged("b", {"w": 40, "o": 30, "g": 30}, log)
    async with registered(agent, "a", workload=a), registered(agent, "b", workload=b):
        first = await switch(client, "a", 1)  # b out, tag by tag
        assert [(s.job_id, s.kind, s.device_bytes) for s in first.steps] == [("b", "snapshot", 100)]
        assert order(log) == [
            ("b", "freed", ("w",)), ("b", "freed", ("o",)), ("b", "freed", ("g",)),
            ("b", "freed", ()),
        ]  # fmt: skip
        log.clear()

        second = await switch(client, "b", 2)
        steps = {(s.job_id, s.kind): s for s in second.steps}
        assert {k: (s.status, s.device_bytes) for k, s in steps.items()} == {
            ("a", "snapshot"): (COMPLETE, 100),
            ("b", "restore"): (COMPLETE, 100),
        }
        assert second.restored
        assert (a.state, b.state) == ("SAVED", "RUNNING")
        # The restore ran with the snapshot (b's first tag in while a's others went
        # out); its elapsed time is what it added after the snapshot ended.
        restore = steps[("b", "restore")]
        assert restore.overlapped_ms >= STEP * 1000, restore
        assert steps[("a", "snapshot")].overlapped_ms == 0
        # b's first tag came in as soon as a's first had gone, long before a's last.
        fills = [i for i, e in enumerate(log) if e.what == "fill"]
        frees = [i for i, e in enumerate(log) if e.job == "a" and e.what == "freed"]
        assert [log[i].tags for i in fills] == [("w",), ("o",), ("g",), ()]
        assert fills[0] < frees[1], order(log)
        assert overdrawn(log, "a", "b") == []


async def test_a_tag_larger_than_what_has_left_waits_for_more(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    log: list[Entry] = []
    a = Tagged("a", {"x": 40, "y": 30, "z": 30}, log)
    b = Tagged("b", {"big": 70, "small": 30}, log)
    async with registered(agent, "a", workload=a), registered(agent, "b", workload=b):
        await switch(client, "a", 1)
        log.clear()
        second = await switch(client, "b", 2)
        assert second.restored
        # 70 bytes fit only once x and y (40 + 30) are out.
        first_fill = next(i for i, e in enumerate(log) if e.what == "fill")
        freed_before = [e.tags for e in log[:first_fill] if e.what == "freed"]
        assert freed_before == [("x",), ("y",)], order(log)
        assert overdrawn(log, "a", "b") == []


async def test_a_restore_whose_steps_are_not_known_comes_in_whole_after_the_snapshots(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    log: list[Entry] = []
    a = Tagged("a", {"w": 40, "o": 30}, log)
    b = Tagged("b", {"w": 40, "o": 30}, log)
    async with registered(agent, "a", workload=a):
        async with registered(agent, "b", workload=b):
            await switch(client, "a", 1)
        # b registers again, saved: the agent no longer knows its steps.
        async with registered(agent, "b", workload=b):
            log.clear()
            second = await switch(client, "b", 2)
            assert second.restored
            assert [s.overlapped_ms for s in second.steps] == [0, 0]
            assert order(log)[-1] == ("b", "fill", ())
            assert [e.what for e in log].count("fill") == 1


async def test_a_workload_that_is_not_pipelined_is_moved_whole_and_frees_at_its_end(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    log: list[Entry] = []
    a = Tagged("a", {"w": 40, "o": 30}, log, pipelined=False)
    b = Tagged("b", {"w": 40, "o": 30}, log)
    async with registered(agent, "a", workload=a), registered(agent, "b", workload=b):
        await switch(client, "a", 1)
        log.clear()
        second = await switch(client, "b", 2)
        assert second.restored
        assert order(log) == [
            ("a", "freed", ()), ("b", "fill", ("w",)), ("b", "fill", ("o",)), ("b", "fill", ()),
        ]  # fmt: skip


async def test_a_snapshot_failing_half_way_faults_its_job_and_the_restore_ends_whole(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    log: list[Entry] = []
    a = Tagged("a", {"w": 40, "o": 30, "g": 30}, log, fail_on="o")
    b = Tagged("b", {"w": 40, "o": 30, "g": 30}, log)
    async with registered(agent, "a", workload=a), registered(agent, "b", workload=b):
        await switch(client, "a", 1)
        log.clear()
        second = await switch(client, "b", 2)
        steps = {(s.job_id, s.kind): s.status for s in second.steps}
        assert steps == {("a", "snapshot"): FAILED, ("b", "restore"): COMPLETE}
        assert second.restored
        assert [j.job_id for j in second.faulted] == ["a"]
        # Before a's snapshot ended (failed), only what it had freed came in.
        assert overdrawn(log, "a", "b") == []
        fills = [e.tags for e in log if e.what == "fill"]
        assert fills == [("w",), ("o",), ("g",), ()]
        assert agent.table.jobs[("g", "a")].state.value == "FAULTED"


async def test_a_workload_whose_snapshot_is_quick_is_moved_whole_the_next_time(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    log: list[Entry] = []
    a = Tagged("a", {"w": 40, "o": 30}, log, step=0.001)
    b = Tagged("b", {"w": 40, "o": 30}, log, step=0.001)
    async with registered(agent, "a", workload=a), registered(agent, "b", workload=b):
        await switch(client, "a", 1)  # b's first: tag by tag, its time not known yet
        assert [e.tags for e in log] == [("w",), ("o",), ()]
        log.clear()
        await switch(client, "b", 2)  # a's first: tag by tag; b in, in its steps
        log.clear()
        third = await switch(client, "a", 3)  # b's snapshot took ms: one command
        assert third.restored
        assert [(e.job, e.what, e.tags) for e in log if e.job == "b"] == [("b", "freed", ())]


async def test_a_step_that_says_it_moved_nothing_is_brought_back_all_the_same(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    log: list[Entry] = []
    a = Tagged("a", {"w": 40, "o": 30}, log)
    b = Tagged("b", {"w": 40, "o": 30}, log, silent=True)
    async with registered(agent, "a", workload=a), registered(agent, "b", workload=b):
        await switch(client, "a", 1)
        assert b.out == {"w", "o"}
        second = await switch(client, "b", 2)
        assert second.restored
        # Its steps freed nothing it said, so each came in once a had left whole.
        assert b.out == set() and b.state == "RUNNING"
        assert overdrawn(log, "a", "b") == []
