"""How `benchmarks/agent.py` times a host-memory workload: each measured cycle is
the second of two back to back, after the baseline, as the baseline's copy is the
second of two (nothing is started here: the workload's process and the calls are
replaced by recorders)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from benchmarks import agent


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    calls: list[tuple[str, float]] = []
    clock = iter(range(1, 1000))

    @contextlib.asynccontextmanager
    async def no_process(*args: Any, **kwargs: Any) -> AsyncIterator[None]:
        yield None

    async def operate(stub: Any, kind: str, request: Any) -> tuple[float, Any]:
        took = float(next(clock))
        calls.append((kind, took))

        class Answer:
            storage_bytes = 8

        return took, Answer()

    monkeypatch.setattr(agent, "Child", no_process)
    monkeypatch.setattr(agent, "operate", operate)
    return calls


async def test_each_measured_cycle_follows_one_unmeasured_after_the_baseline(
    recorded: list[tuple[str, float]],
) -> None:
    args = agent.parse_args(["--cycles", "2"])

    def baseline() -> float:
        recorded.append(("baseline", 0.0))
        return 0.5

    stub: Any = None  # `operate` is the recorder: no call goes out
    snaps, restores, base, moved = await agent.measure_workload(
        stub, "agent", args, "memory", "m", baseline
    )
    kinds = [kind for kind, _ in recorded]
    cycle = ["baseline", "snapshot", "restore", "snapshot", "restore"]
    assert kinds == cycle * 2
    # Only the second cycle after each baseline counts.
    assert snaps == [3.0, 7.0] and restores == [4.0, 8.0]
    assert base == [0.5, 0.5] and moved == 8
