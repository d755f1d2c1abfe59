"""Acquire and yield latency with thousands of Watch streams open, against none.

    python benchmarks/watchers.py --json results.json [--watchers 4000] [--quick]

The orchestrator runs in a process of its own, journaling to SQLite in a
temporary directory; one job in this process loops acquire -> yield on one
group, each call timed, back to back. It does so in three phases of one run:

  none    no Watch stream open;
  every   N Watch streams of every group, opened by P processes of their own (at
          most 100 streams per connection: the server's limit is 128): each of
          them is sent every grant and every yield;
  other   the same N streams watching another group: they are sent nothing, but
          are there;
  none    no Watch stream open, again.

The baseline is both `none` phases' samples together, so that a machine whose
load drifts during the run (other work on it) moves both sides alike.

The watchers only count the messages they receive (they decode nothing). After
the `every` phase each must have received every event: the counts are checked
and reported beside the number of events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import grpclib.client  # noqa: E402
from grpclib.const import Cardinality  # noqa: E402

from benchmarks.common import (  # noqa: E402
    CALL_TIMEOUT,
    Child,
    RawCodec,
    Row,
    ServerProcess,
    Usage,
    add_common_arguments,
    channel,
    describe,
    format_table,
    machine,
    ms,
    now,
    percentile,
    receive,
    run_main,
)
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb  # noqa: E402

GROUP, OTHER, JOB = "watched", "elsewhere", "job-a"
WATCH_ROUTE = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/Watch"
PER_CONNECTION = 100


# --- the watchers, in processes of their own --------------------------------------------------


def watch_streams(conn: Connection, address: str, streams: int, group: str) -> None:
    """Process entry point: `streams` Watch streams of `group` ("" every group) on
    `address`; its first message says how many are open (each has had the
    group's CURRENT event); "counts" answers the messages each has received.

    It runs at the lowest CPU priority: on a machine with fewer cores than
    processes, reading thousands of streams would otherwise take the CPU from the
    orchestrator and the timed job, and the figures would be the machine's."""
    with contextlib.suppress(OSError):
        os.nice(19)
    asyncio.run(_watch_streams(conn, address, streams, group))


async def _watch_streams(conn: Connection, address: str, streams: int, group: str) -> None:
    host, port = address.rsplit(":", 1)
    channels = [
        grpclib.client.Channel(host, int(port), codec=RawCodec())
        for _ in range(math.ceil(streams / PER_CONNECTION))
    ]
    counts = [0] * streams
    opened = asyncio.Semaphore(0)

    async def follow(i: int) -> None:
        async with channels[i // PER_CONNECTION].request(
            WATCH_ROUTE, Cardinality.UNARY_STREAM, pb.WatchRequest, bytes
        ) as stream:
            await stream.send_message(pb.WatchRequest(group_id=group), end=True)
            first = True
            async for _ in stream:
                counts[i] += 1
                if first:
                    opened.release()
                    first = False

    tasks = [asyncio.create_task(follow(i)) for i in range(streams)]
    try:
        for _ in range(streams):
            async with asyncio.timeout(120):
                await opened.acquire()
        conn.send(streams)
        while (command := await receive(conn)) != "stop":
            if command == "counts":
                conn.send(list(counts))
            else:
                raise ValueError(f"unknown command {command!r}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            ch.close()


class Watchers(contextlib.AsyncExitStack):
    """`total` Watch streams of `group` from `processes` processes, all open on entry."""

    def __init__(self, address: str, total: int, processes: int, group: str) -> None:
        super().__init__()
        share = math.ceil(total / processes)
        self.children = [
            Child(watch_streams, address, min(share, total - i * share), group, name="bench-watch")
            for i in range(processes)
            if total - i * share > 0
        ]

    async def __aenter__(self) -> Watchers:
        await super().__aenter__()
        for child in self.children:
            await self.enter_async_context(child)
        return self

    async def counts(self) -> list[int]:
        return [n for child in self.children for n in await child.ask("counts")]


# --- the measurement ----------------------------------------------------------------------


async def cycles(address: str, samples: int, warmup: int) -> dict[str, list[float]]:
    """Back-to-back acquire -> yield of one job on GROUP: each call's seconds."""
    times: dict[str, list[float]] = {"acquire": [], "yield": []}
    async with channel(address) as ch:
        stub = pb.TimeSliceOrchestratorServiceStub(ch, timeout=CALL_TIMEOUT)
        for i in range(warmup + samples):
            t0 = now()
            await stub.acquire(pb.AcquireRequest(group_id=GROUP, job_id=JOB))
            t1 = now()
            await stub.yield_(pb.YieldRequest(group_id=GROUP, job_id=JOB))
            t2 = now()
            if i >= warmup:
                times["acquire"].append(t1 - t0)
                times["yield"].append(t2 - t1)
    return times


class Phase:
    """One phase's timed calls, and what the orchestrator used meanwhile."""

    def __init__(self, name: str, watchers: int) -> None:
        self.name, self.watchers = name, watchers
        self.times: dict[str, list[float]] = {"acquire": [], "yield": []}
        self.cycles = 0
        self.cpu = self.gc = 0.0
        self.full_gcs = self.objects = 0

    async def measure(self, orch: ServerProcess, samples: int, warmup: int) -> Phase:
        before: Usage = await orch.ask("usage")
        times = await cycles(orch.address, samples, warmup)
        after: Usage = await orch.ask("usage")
        for call, values in times.items():
            self.times[call] += values
        self.cycles += warmup + samples
        self.cpu += after.cpu - before.cpu
        self.gc += after.gc - before.gc
        self.full_gcs += after.full_gcs - before.full_gcs
        self.objects = after.objects
        return self

    @classmethod
    def pooled(cls, name: str, *parts: Phase) -> Phase:
        """`parts` as one phase: their samples together."""
        pool = cls(name, parts[0].watchers)
        for part in parts:
            for call, values in part.times.items():
                pool.times[call] += values
            pool.cycles += part.cycles
            pool.cpu, pool.gc = pool.cpu + part.cpu, pool.gc + part.gc
            pool.full_gcs += part.full_gcs
            pool.objects = part.objects
        return pool

    def result(self) -> dict[str, Any]:
        result: dict[str, Any] = {"phase": self.name, "watchers": self.watchers,
                                  "cycles": self.cycles}  # fmt: skip
        for call, values in self.times.items():
            result[f"{call}_p50_ms"] = statistics.median(values) * ms
            result[f"{call}_p99_ms"] = percentile(values, 0.99) * ms
        result["server_cpu_ms_per_cycle"] = self.cpu / self.cycles * ms
        result["server_gc_ms_per_cycle"] = self.gc / self.cycles * ms
        result["server_full_gcs"] = self.full_gcs
        result["server_objects"] = self.objects
        return result


async def delivered(
    watchers: Watchers, expected: int, orch: ServerProcess, cap: float = 60.0
) -> dict[str, Any]:
    """Wait until every watcher has `expected` messages (or `cap` seconds pass); with
    the orchestrator's CPU meanwhile (little: the watchers' reading is what takes
    the time, on a machine with few cores)."""
    before: Usage = await orch.ask("usage")
    started = now()
    while True:
        counts = await watchers.counts()
        if min(counts) >= expected or now() - started > cap:
            break
        await asyncio.sleep(0.2)
    after: Usage = await orch.ask("usage")
    return {
        "server_cpu_s": after.cpu - before.cpu,
        "expected": expected,
        "min": min(counts),
        "max": max(counts),
        "complete": sum(c == expected for c in counts),
        "settle_s": now() - started,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        options = {"max_watchers": args.watchers + 16}
        async with ServerProcess("orchestrator", f"{tmp}/journal.db", **options) as orch:
            async with channel(orch.address) as ch:  # both groups exist: watchers get CURRENT
                stub = pb.TimeSliceOrchestratorServiceStub(ch, timeout=CALL_TIMEOUT)
                for group in (GROUP, OTHER):
                    await stub.acquire(pb.AcquireRequest(group_id=group, job_id=JOB))
                    await stub.yield_(pb.YieldRequest(group_id=group, job_id=JOB))
            first = await Phase("none-before", 0).measure(orch, args.samples, args.warmup)
            opened = time.monotonic()
            async with Watchers(orch.address, args.watchers, args.processes, "") as watchers:
                open_s = time.monotonic() - opened
                every = Phase("every", args.watchers)
                await every.measure(orch, args.samples, args.warmup)
                # Each watcher: its CURRENT events (one per group), then a grant and a yield
                # per cycle.
                every_result = every.result()
                every_result["delivery"] = await delivered(watchers, 2 + 2 * every.cycles, orch)
                every_result["open_s"] = open_s
            async with Watchers(orch.address, args.watchers, args.processes, OTHER):
                other = await Phase("other", args.watchers).measure(orch, args.samples, args.warmup)
            last = await Phase("none-after", 0).measure(orch, args.samples, args.warmup)
            none = Phase.pooled("none", first, last)
            phases = [none.result(), first.result(), every_result, other.result(), last.result()]
    return {
        "benchmark": "watchers",
        "phases": phases,
        "parameters": {
            "watchers": args.watchers,
            "processes": args.processes,
            "per_connection": PER_CONNECTION,
            "samples": args.samples,
            "warmup": args.warmup,
            "quick": args.quick,
            "journal": "sqlite file in a temp dir, WAL, synchronous=FULL",
            "transport": "grpclib over TCP loopback; orchestrator and watchers in spawned"
            " processes, the timed job in this one",
        },
        "machine": machine(),
    }


def summary(r: dict[str, Any]) -> list[Row]:
    """Each call's median with N watchers of every group, and of another group,
    against none; the orchestrator's CPU per cycle; what the watchers received."""
    by = {p["phase"]: p for p in r["phases"]}
    none, n = by["none"], f"{r['parameters']['watchers']:,}"
    before, after = by["none-before"], by["none-after"]
    rows = []
    for key, what in (("every", "of every group"), ("other", "of another group")):
        p = by[key]
        for call in ("acquire", "yield"):
            rows.append(
                Row(f"{call} p50, {n} watchers {what}", p[f"{call}_p50_ms"],
                    none[f"{call}_p50_ms"], "ms",
                    f"baseline: no watcher, before and after in the same run (p50 "
                    f"{before[f'{call}_p50_ms']:.2f} and {after[f'{call}_p50_ms']:.2f} ms); p99 "
                    f"{p[f'{call}_p99_ms']:.2f} ms against {none[f'{call}_p99_ms']:.2f} ms")
            )  # fmt: skip
        rows.append(
            Row(f"orchestrator CPU per cycle, {n} watchers {what}",
                p["server_cpu_ms_per_cycle"], none["server_cpu_ms_per_cycle"], "ms",
                f"baseline: no watcher; a cycle is an acquire and a yield; garbage collection "
                f"{p['server_gc_ms_per_cycle']:.2f} ms of it ({p['server_full_gcs']} full, "
                f"{p['server_objects'] / 1000:,.0f}k objects) against "
                f"{none['server_gc_ms_per_cycle']:.2f} ms")
        )  # fmt: skip
    d = by["every"]["delivery"]
    rows.append(
        Row("messages each watcher of every group received (fewest)", d["min"], d["expected"],
            "", f"baseline: events published; {d['complete']:,} of {n} watchers got them all, "
            f"{d['settle_s']:.1f} s after the last cycle (the orchestrator busy "
            f"{d['server_cpu_s']:.1f} s of it: the rest is the watchers' reading)")
    )  # fmt: skip
    return rows


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice watchers benchmark: {describe(r['machine'])}")
    print(
        f"{p['watchers']:,} Watch streams from {p['processes']} processes, "
        f"{p['per_connection']} per connection; {p['samples']} timed cycles per phase\n"
    )
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--watchers", type=int, default=4000, help="Watch streams to open")
    parser.add_argument("--processes", type=int, default=4, help="processes that open them")
    parser.add_argument("--samples", type=int, default=400, help="timed cycles per phase")
    parser.add_argument("--warmup", type=int, default=50, help="untimed cycles first")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.warmup = min(args.samples, 100), min(args.warmup, 20)
    if args.watchers < 1 or args.processes < 1 or args.samples < 1:
        parser.error("--watchers, --processes and --samples must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
