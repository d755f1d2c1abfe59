"""`timeslice demo`: jobs sharing one accelerator group through a real Orchestrator.

Each simulated RL job loops: a CPU phase (generation stragglers, reward
scoring: the accelerator is not needed), then an accelerator phase inside
`async with client.acquire():`. The same jobs run twice through the same code
and the same gRPC orchestrator with its SQLite journal: first back to back (one
job after the other: no sharing), then all at once, taking turns. Both wall
times are measured; the speedup is their ratio.

The accelerator phases here are timed waits and no device memory moves: the
lock, its journal and the handoffs between jobs are real.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from timeslice.client import AsyncTimeSliceOrchestratorClient
from timeslice.orchestrator.server import Orchestrator

GROUP = "accelerators"


@dataclass
class JobLog:
    """What one job saw."""

    name: str
    holds: list[tuple[float, float]] = field(default_factory=list)  # (granted, released)
    waits: list[float] = field(default_factory=list)


async def run_job(
    target: str, log: JobLog, steps: int, cpu_s: float, accel_s: float, progress: dict[str, int]
) -> None:
    """One simulated RL job: `steps` rounds of a CPU phase then an accelerator phase."""
    async with AsyncTimeSliceOrchestratorClient(target, job_id=log.name, group_id=GROUP) as client:
        for step in range(steps):
            await asyncio.sleep(cpu_s)
            asked = time.monotonic()
            async with client.acquire():
                granted = time.monotonic()
                await asyncio.sleep(accel_s)
                released = time.monotonic()
            log.holds.append((granted, released))
            log.waits.append(granted - asked)
            progress[log.name] = step + 1


async def run_round(
    target: str, jobs: int, steps: int, cpu_s: float, accel_s: float, shared: bool
) -> tuple[float, list[JobLog]]:
    """Run the jobs together (`shared`) or one after another; return wall time and logs."""
    logs = [JobLog(f"job-{i + 1}") for i in range(jobs)]
    progress = {log.name: 0 for log in logs}
    label = "time-sliced " if shared else "back to back"
    start = time.monotonic()
    show = asyncio.create_task(_show_progress(label, progress, steps))
    try:
        if shared:
            await asyncio.gather(
                *(run_job(target, log, steps, cpu_s, accel_s, progress) for log in logs)
            )
        else:
            for log in logs:
                await run_job(target, log, steps, cpu_s, accel_s, progress)
    finally:
        show.cancel()
    wall = time.monotonic() - start
    _print_progress(label, progress, steps, final=True)
    return wall, logs


async def _show_progress(label: str, progress: dict[str, int], steps: int) -> None:
    while True:
        _print_progress(label, progress, steps)
        await asyncio.sleep(0.2)


def _print_progress(label: str, progress: dict[str, int], steps: int, final: bool = False) -> None:
    bars = "  ".join(
        f"{name} {'#' * done}{'.' * (steps - done)}" for name, done in progress.items()
    )
    end = "\n" if final or not sys.stdout.isatty() else "\r"
    if final or sys.stdout.isatty():
        print(f"  {label}: {bars}", end=end, flush=True)


def _handoff_gaps(logs: list[JobLog]) -> list[float]:
    """For each grant that followed another job's release: the gap between them."""
    holds = sorted((g, r, log.name) for log in logs for g, r in log.holds)
    return [
        g2 - r1
        for (_, r1, n1), (g2, _, n2) in zip(holds, holds[1:], strict=False)
        if n1 != n2 and g2 >= r1
    ]


def _busy_share(logs: list[JobLog], wall: float) -> float:
    return sum(r - g for log in logs for g, r in log.holds) / wall


async def demo(
    jobs: int = 2,
    steps: int = 8,
    cpu_s: float = 0.15,
    accel_s: float = 0.15,
    journal: Path | None = None,
) -> dict[str, float]:
    """Run the demo; print the table; return its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        path = journal or Path(tmp) / "journal.db"
        async with Orchestrator(db=f"sqlite:///{path}") as orch:
            print(f"orchestrator on {orch.address}, journal {path}")
            print(
                f"{jobs} jobs x {steps} steps; each step {cpu_s * 1000:.0f} ms CPU, then {accel_s * 1000:.0f} ms on the accelerators"
            )
            alone, alone_logs = await run_round(
                orch.address, jobs, steps, cpu_s, accel_s, shared=False
            )
            shared, shared_logs = await run_round(
                orch.address, jobs, steps, cpu_s, accel_s, shared=True
            )
            tokens = orch.group(GROUP).token
        gaps = _handoff_gaps(shared_logs)
        waits = [w for log in shared_logs for w in log.waits]
        figures = {
            "back_to_back_s": alone,
            "time_sliced_s": shared,
            "speedup": alone / shared,
            "busy_back_to_back": _busy_share(alone_logs, alone),
            "busy_time_sliced": _busy_share(shared_logs, shared),
            "grants": float(tokens),
            "handoff_median_ms": statistics.median(gaps) * 1000 if gaps else 0.0,
            "wait_median_ms": statistics.median(waits) * 1000,
        }
        rows = [
            ("wall time", f"{alone:.2f} s", f"{shared:.2f} s"),
            ("speedup", "1.00x", f"{figures['speedup']:.2f}x"),
            (
                "accelerator busy",
                f"{figures['busy_back_to_back']:.0%}",
                f"{figures['busy_time_sliced']:.0%}",
            ),
            ("handoffs between jobs", "-", str(len(gaps))),
            (
                "median handoff (release -> next grant)",
                "-",
                f"{figures['handoff_median_ms']:.2f} ms",
            ),
            ("median wait for the lock", "-", f"{figures['wait_median_ms']:.1f} ms"),
        ]
        width = max(len(r[0]) for r in rows)
        print(f"\n{'':{width}}  {'back to back':>14}  {'time-sliced':>14}")
        for name, a, b in rows:
            print(f"{name:{width}}  {a:>14}  {b:>14}")
        print(
            f"\n{int(tokens)} grants journaled in {path}"
            + ("" if journal else " (a temporary file, now removed)")
        )
        return figures
