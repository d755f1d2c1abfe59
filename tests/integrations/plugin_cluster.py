"""A real orchestrator and node agent, in this process, for synchronous training loops.

The plugins are driven by plain (blocking) training loops, so the servers run on
an event loop of their own, on a daemon thread; the test's threads are the
jobs. `Cluster.call` runs a function on the servers' loop, to read their state
between steps without racing it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.client._bridge import LoopThread
from timeslice.orchestrator.server import Orchestrator

T = TypeVar("T")


class Cluster:
    """One orchestrator and one agent (node ``n1``, backend ``app_channel``) whose
    node every group of ``groups`` spans, so that each grant switches the jobs'
    workloads on it."""

    def __init__(self, tmp_path: Path, groups: Sequence[str]) -> None:
        self.groups = tuple(groups)
        self._db = f"sqlite:///{tmp_path / 'agent.db'}"
        self._runner = LoopThread("test-cluster")
        self._stack = AsyncExitStack()
        self._effects: list[Any] = []
        self.orch: Orchestrator
        self.agent: Agent

    def __enter__(self) -> Cluster:
        try:
            self._runner.run(self._start)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def _start(self) -> None:
        self.orch = await self._stack.enter_async_context(Orchestrator(switch_timeout=10))
        self.agent = await self._stack.enter_async_context(
            Agent(
                node_name="n1",
                db=self._db,
                backends=("app_channel",),
                orchestrator=self.orch.address,
                groups=self.groups,
            )
        )
        watch = self.orch.watch("")
        self._stack.callback(watch.close)
        self._stack.push_async_callback(_cancel, asyncio.create_task(self._record(watch)))
        for group in self.groups:
            await until(
                lambda g=group: "n1" in self.orch.table.nodes.get(g, ()), f"n1 joined {group}"
            )

    async def _record(self, watch: Any) -> None:
        async for notice in watch:
            self._effects.append(notice.effect)

    def close(self) -> None:
        """Stops the servers. Idempotent."""
        if self._runner.thread.is_alive():
            try:
                self._runner.run(self._stack.aclose)
            finally:
                self._runner.stop()
                self._runner.join(10)

    @property
    def orchestrator_address(self) -> str:
        return self.orch.address

    @property
    def agent_address(self) -> str:
        return self.agent.address

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, run on the servers' event loop."""

        async def run() -> T:
            return fn()

        return self._runner.run(run)

    def holder(self, group: str) -> str | None:
        """The job holding ``group`` now, per the orchestrator's lock table."""

        def read() -> str | None:
            state = self.orch.table.groups.get(group)
            return None if state is None or state.holder is None else state.holder.job

        return self.call(read)

    def registered(self, group: str, job: str) -> bool:
        """Whether the agent has the job's workload in ``group`` and the orchestrator
        has heard that it is alive."""

        def read() -> bool:
            return (
                self.agent.channels.get(group, job) is not None
                and self.orch.agents.liveness("n1", group, job) == "ALIVE"
            )

        return self.call(read)

    def wait_registered(self, group: str, jobs: Sequence[str], timeout: float = 10.0) -> None:
        """Blocks until every job of ``jobs`` is `registered` in ``group``."""
        deadline = time.monotonic() + timeout
        while not all(self.registered(group, job) for job in jobs):
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout} s: {list(jobs)} registered in {group}")
            time.sleep(0.01)

    def effects(self, kind: type[Any]) -> list[Any]:
        """The orchestrator's effects of type ``kind`` so far (`Granted`, `Yielded`...),
        in order, as its watch reported them."""
        return self.call(lambda: [e for e in self._effects if isinstance(e, kind)])

    def agent_state(self, group: str, job: str) -> str | None:
        """The job's context state on the agent (RUNNING, SAVED...)."""

        def read() -> str | None:
            found = self.agent.table.jobs.get((group, job))
            return None if found is None else str(found.state.value)

        return self.call(read)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
