"""How `benchmarks/anchors.py` orders its measurements: the handoffs, then the
cycles, each in blocks that go round the systems in turn, and every block's
cycles pooled per system (nothing is started here: the measuring functions are
replaced by recorders)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from benchmarks import anchors
from benchmarks.common import Rate


def rate(per_second: float, cpu: float) -> Rate:
    """One window of a second at `per_second` in both half-second slices, `cpu`
    seconds of server CPU over its steps."""
    steps = round(per_second)
    return Rate(
        completed=steps,
        window=1.0,
        slices=(per_second, per_second),
        client_cpu=0.0,
        server_cpu=cpu,
        server_gc=0.0,
        server_steps=steps,
        server_span=1.0,
    )


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    # Ours cycles at another rate in each block; every other system at 50 a second.
    speeds = {("ours", 0): 100.0, ("ours", 1): 400.0, ("ours", 2): 200.0}

    async def handoffs(
        system: str, server: Any, samples: int, warmup: int, settle: float
    ) -> list[float]:
        calls.append(("handoffs", system, samples))
        return [0.001] * samples

    async def cycles(
        system: str, server: Any, args: argparse.Namespace, loops: str, per_connection: int
    ) -> Rate:
        block = int(loops.rsplit("-", 1)[1])
        calls.append(("cycles", system, loops, per_connection))
        return rate(speeds.get((system, block), 50.0), 0.01)

    monkeypatch.setattr(anchors, "handoffs", handoffs)
    monkeypatch.setattr(anchors, "cycles", cycles)
    return calls


async def test_the_cycles_go_round_the_systems_block_by_block_after_the_handoffs(
    recorded: list[tuple[Any, ...]],
) -> None:
    args = anchors.parse_args([])
    servers = {"ours": object(), "etcd": object(), "redis": object()}
    figured = await anchors.measure(servers, args)

    kinds = [call[0] for call in recorded]
    assert kinds == ["handoffs"] * 9 + ["cycles"] * 15  # 3 blocks; ours and etcd twice
    handoff_order = [call[1] for call in recorded[:9]]
    assert handoff_order == ["ours", "etcd", "redis", "etcd", "redis", "ours", "redis", "ours",
                             "etcd"]  # fmt: skip
    cycle_order = [(call[1], call[2]) for call in recorded[9:]]
    assert cycle_order == [
        ("ours", "cycles-0"), ("ours", "shared_cycles-0"),
        ("etcd", "cycles-0"), ("etcd", "shared_cycles-0"),
        ("redis", "cycles-0"),
        ("etcd", "cycles-1"), ("etcd", "shared_cycles-1"),
        ("redis", "cycles-1"),
        ("ours", "cycles-1"), ("ours", "shared_cycles-1"),
        ("redis", "cycles-2"),
        ("ours", "cycles-2"), ("ours", "shared_cycles-2"),
        ("etcd", "cycles-2"), ("etcd", "shared_cycles-2"),
    ]  # fmt: skip
    # Each system's figures pool its three blocks: the median of every slice, the
    # CPU per cycle from the totals.
    ours = figured["ours"]
    assert ours["cycles_per_s"] == 200.0
    assert ours["cycles_completed"] == 700
    assert ours["cycles_server_cpu_ms_per_step"] == pytest.approx(3 * 10 / 700)
    assert figured["etcd"]["shared_cycles_per_s"] == 50.0
    assert "shared_cycles_per_s" not in figured["redis"]  # a blocked connection serves one job
    assert figured["redis"]["handoffs"] == args.handoffs


async def test_a_quick_run_is_one_block_of_each(recorded: list[tuple[Any, ...]]) -> None:
    args = anchors.parse_args(["--quick"])
    await anchors.measure({"ours": object(), "etcd": object()}, args)
    assert [call[:2] for call in recorded] == [
        ("handoffs", "ours"), ("handoffs", "etcd"),
        ("cycles", "ours"), ("cycles", "ours"), ("cycles", "etcd"), ("cycles", "etcd"),
    ]  # fmt: skip
