"""Lock throughput as jobs grow: acquire/yield cycles per second against echoes.

    python benchmarks/cycles.py --json OUT [--jobs 10 100 1000 10000] [--quick]

For each number of jobs (10 jobs per group: 10 jobs share 1 group, 10,000 share
1,000), in one run, side by side:

  echo      a plain grpclib unary round trip, back to back (the floor of one
            call); then as many loops as there are jobs, over the same
            connections, each doing two echoes per step (as many calls as a
            cycle): steps per second, and the echo server's CPU per step, in
            two windows of half the length, before and after the cycles.
  cycles    a fresh orchestrator (its own process, SQLite journal on disk with
            its defaults: WAL, synchronous=FULL, a snapshot every 1,000 events)
            and the jobs, each looping acquire -> yield on its group: cycles
            per second, and the orchestrator's CPU per cycle.

The jobs share connections, at most `--per-connection` (100, the HTTP/2 stream
limit the server announces) on each: 10,000 jobs use 100 connections. Each point
is bounded in time: the window opens once every job is in the orchestrator's
table, holding or queued (but for one per group between its Yield and its next
Acquire), at most `--warmup-cap` seconds after the jobs start, and stays open
`--window` seconds; then the jobs are cancelled and the orchestrator stopped. With 10 jobs
in one group the cycles are handoffs one after another; with more groups, the
orchestrator batches the journal writes of many groups. Rates are the median of
the rates of the windows' half-second slices; CPU per step comes from the totals.
Each server also reports the share of its CPU spent in Python's garbage
collector (which stops its event loop while it runs).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from grpclib.client import Channel  # noqa: E402

from benchmarks.common import (  # noqa: E402
    EchoStub,
    Rate,
    Row,
    ServerProcess,
    add_common_arguments,
    describe,
    drained,
    echo_request,
    format_table,
    machine,
    measure_echo,
    measure_rate,
    ms,
    number,
    run_main,
)
from benchmarks.handoff import acquire_yield  # noqa: E402


def echo_pair(ch: Channel, index: int) -> Callable[[], Any]:
    """Loop `index`: each step is two echo round trips, as many calls as a cycle."""
    stub, request = EchoStub(ch), echo_request()

    async def step() -> None:
        await stub.echo(request)
        await stub.echo(request)

    return step


def settled(orch: ServerProcess, jobs: int, groups: int) -> Callable[[], Any]:
    """Whether every job is in the orchestrator's table, holding or queued, but for
    at most one per group between its Yield and its next Acquire: the first
    Acquires of all the jobs are behind, the groups take turns."""

    async def ready() -> bool:
        table = await orch.ask("table")
        return bool(table["holders"] + table["waiting"] >= jobs - groups)

    return ready


def over(a: float, b: float) -> float:
    return a / b if b else math.nan


def figures(prefix: str, rates: list[Rate]) -> dict[str, Any]:
    """What `rates` (windows of the same loops) measured, pooled: steps per second as
    the median of their slices' rates (and the mean), CPU per step from the totals."""
    completed, window = sum(r.completed for r in rates), sum(r.window for r in rates)
    client_cpu = sum(r.client_cpu for r in rates)
    server_cpu, span = sum(r.server_cpu for r in rates), sum(r.server_span for r in rates)
    return {
        f"{prefix}_per_s": statistics.median([s for r in rates for s in r.slices]),
        f"{prefix}_mean_per_s": completed / window,
        f"{prefix}_completed": completed,
        f"{prefix}_window_s": window,
        f"{prefix}_server_cpu_ms_per_step": over(
            server_cpu * ms, sum(r.server_steps for r in rates)
        ),
        f"{prefix}_client_cpu_ms_per_step": over(client_cpu * ms, completed),
        f"{prefix}_server_cpu_pct": over(100 * server_cpu, span),
        f"{prefix}_client_cpu_pct": over(100 * client_cpu, window),
        f"{prefix}_server_gc_pct_of_cpu": over(100 * sum(r.server_gc for r in rates), server_cpu),
        f"{prefix}_server_full_gcs": sum(r.server_full_gcs for r in rates),
        f"{prefix}_server_objects": rates[-1].server_objects,
        f"{prefix}_warmup_s": rates[0].warmup,
        f"{prefix}_ready": all(r.ready for r in rates),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    points = []
    async with ServerProcess("echo") as echo:
        for jobs in args.jobs:
            groups = max(1, jobs // args.jobs_per_group)
            connections = math.ceil(jobs / args.per_connection)
            rtt = await measure_echo(echo.address, args.echoes, warmup=20)

            async def echoes() -> Rate:
                return await measure_rate(
                    echo.address,
                    jobs,
                    echo_pair,
                    warmup=args.warmup,
                    window=args.window / 2,
                    per_connection=args.per_connection,
                    server=echo,
                )

            before = await echoes()
            with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
                async with ServerProcess("orchestrator", f"{tmp}/journal.db") as orch:
                    cycles = await measure_rate(
                        orch.address,
                        jobs,
                        acquire_yield(groups),
                        warmup=args.warmup,
                        window=args.window,
                        per_connection=args.per_connection,
                        server=orch,
                        ready=settled(orch, jobs, groups),
                        warmup_cap=args.warmup_cap,
                    )
                    await drained(orch)
            after = await echoes()
            point = {
                "jobs": jobs,
                "groups": groups,
                "connections": connections,
                "echo_rtt_p50_ms": statistics.median(rtt) * ms,
                **figures("echo_pairs", [before, after]),
                **figures("cycles", [cycles]),
            }
            point["cycle_ms"] = ms / point["cycles_per_s"] if cycles.completed else math.nan
            point["cycles_over_echo_pairs"] = over(point["cycles_per_s"], point["echo_pairs_per_s"])
            points.append(point)
            print(
                f"  {jobs} jobs: {point['cycles_per_s']:.0f} cycles/s, "
                f"{point['echo_pairs_per_s']:.0f} echo pairs/s",
                flush=True,
            )
    return {
        "points": points,
        "parameters": {
            "jobs": args.jobs,
            "jobs_per_group": args.jobs_per_group,
            "per_connection": args.per_connection,
            "warmup_s": args.warmup,
            "warmup_cap_s": args.warmup_cap,
            "window_s": args.window,
            "echoes": args.echoes,
            "quick": args.quick,
            "journal": "sqlite file in a temp dir, WAL, synchronous=FULL, snapshot every 1000",
            "transport": "grpclib over TCP loopback; servers in spawned processes",
        },
        "machine": machine(),
    }


def summary(r: dict[str, Any]) -> list[Row]:
    """Per point: cycles/s against echo pairs/s at the same concurrency, and the
    orchestrator's CPU per cycle against the echo server's per pair and against
    the first point's."""
    rows = []
    first = r["points"][0] if r["points"] else None
    for p in r["points"]:
        jobs, groups = f"{p['jobs']:,} jobs", f"{p['groups']:,} group" + "s" * (p["groups"] > 1)
        connections = f"{p['connections']} connection" + "s" * (p["connections"] > 1)
        alone = "; one group: handoffs one after another" if p["groups"] == 1 else ""
        late = "" if p["cycles_ready"] else "; the window opened before every job was queued"
        rows.append(
            Row(f"cycles/s, {jobs} in {groups}", p["cycles_per_s"], p["echo_pairs_per_s"], "/s",
                f"baseline: {p['jobs']:,} loops of 2 echoes over the same {connections}; CPU: "
                f"orchestrator {p['cycles_server_cpu_pct']:.0f} %, clients "
                f"{p['cycles_client_cpu_pct']:.0f} %{alone}{late}")
        )  # fmt: skip
        rows.append(
            Row(f"orchestrator CPU per cycle, {jobs}", p["cycles_server_cpu_ms_per_step"],
                p["echo_pairs_server_cpu_ms_per_step"], "ms",
                f"baseline: echo server CPU per 2 echoes; garbage collection "
                f"{p['cycles_server_gc_pct_of_cpu']:.0f} % of the orchestrator's CPU "
                f"({p['cycles_server_objects'] / 1000:,.0f}k objects), "
                f"{p['echo_pairs_server_gc_pct_of_cpu']:.0f} % of the echo server's")
        )  # fmt: skip
        if first is not None and p is not first:
            rows.append(
                Row(f"orchestrator CPU per cycle, {jobs} against {first['jobs']:,} jobs",
                    p["cycles_server_cpu_ms_per_step"], first["cycles_server_cpu_ms_per_step"],
                    "ms", f"baseline: the same at {first['jobs']:,} jobs in this run; a cycle "
                    f"every {number(p['cycle_ms'])} ms = "
                    f"{p['cycle_ms'] / p['echo_rtt_p50_ms']:.2f} back-to-back echo round trips")
            )  # fmt: skip
    return rows


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice cycles benchmark: {describe(r['machine'])}")
    print(
        f"{p['jobs_per_group']} jobs per group, at most {p['per_connection']} jobs per "
        f"connection; window {p['window_s']:g} s per point\n"
    )
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument(
        "--jobs", type=int, nargs="+", default=[10, 100, 1000, 10000], help="points to measure"
    )
    parser.add_argument("--jobs-per-group", type=int, default=10, help="jobs sharing a group")
    parser.add_argument(
        "--per-connection", type=int, default=100, help="most jobs sharing one connection"
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before a window")
    parser.add_argument(
        "--warmup-cap", type=float, default=15.0, help="longest wait for every job to queue"
    )
    parser.add_argument("--window", type=float, default=4.0, help="seconds counted per point")
    parser.add_argument("--echoes", type=int, default=300, help="back-to-back echoes per point")
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.warmup_cap = min(args.warmup, 0.5), min(args.warmup_cap, 4.0)
        args.window, args.echoes = min(args.window, 1.0), min(args.echoes, 100)
    if not 1 <= args.per_connection <= 100:
        parser.error("--per-connection: 1 to 100 (the server's HTTP/2 stream limit)")
    if min(args.jobs) < 1 or args.jobs_per_group < 1:
        parser.error("--jobs and --jobs-per-group must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
