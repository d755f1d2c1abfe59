"""What metrics cost: handoff latency and lock throughput of an orchestrator with
its metrics port on and scraped, against the same with metrics off, in one run.

    python benchmarks/metrics_cost.py --json benchmarks/results/metrics_cost.json [--quick]

Both variants run the measurements of benchmarks/handoff.py on a fresh
orchestrator (its own process, SQLite journal on disk with its defaults):

  handoff   job A's Yield sent -> job B's blocked Acquire returned (A and B in
            separate processes, on connections of their own);
  cycles    100 jobs in 10 groups looping acquire -> yield: cycles per second.

  off       `metrics_port` 0 (the default): nothing of the metrics is loaded.
  on        `metrics_port` set: every event's effects observed, every journal
            commit timed, and `/metrics` scraped over HTTP every
            `--scrape-interval` seconds while the measurements run (Prometheus
            scrapes every 15 to 60 s; this scrapes far more often).

  observe   in this process, no I/O: the lock table handling acquire/yield
            handoffs between two jobs of each of 10 groups, alone and with
            `OrchestratorMetrics.observe` fed every event's effects as the
            journal engine feeds it: the CPU the metrics add per handoff, free
            of the machine's noise that the end-to-end figures carry.

The variants alternate, `--rounds` times each (off first in even rounds, on
first in odd ones), so that both see the same machine. Reported: the median
handoff over every round's samples, the median of the rounds' cycle rates, and
on / off for each (target: at most 1.1x, and for cycles at least 1 / 1.1 of
off), with the scrapes' count, size and median time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import httpx  # noqa: E402

from benchmarks.common import (  # noqa: E402
    Row,
    ServerProcess,
    add_common_arguments,
    describe,
    format_table,
    free_port,
    machine,
    ms,
    now,
    percentile,
    run_main,
)
from benchmarks.handoff import measure_cycles, measure_handoffs  # noqa: E402

TARGET = 1.1
OBSERVE_GROUPS = 10
VARIANTS = ("off", "on")


async def scraping(address: str, interval: float, seen: list[tuple[float, int]]) -> None:
    """GET /metrics every `interval` seconds until cancelled: (seconds, bytes) each."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            t0 = now()
            answer = await client.get(f"http://{address}/metrics")
            answer.raise_for_status()
            seen.append((now() - t0, len(answer.content)))
            await asyncio.sleep(interval)


async def run_variant(
    name: str, db: str, args: argparse.Namespace
) -> tuple[list[float], float, list[tuple[float, int]]]:
    """One fresh orchestrator of the variant: its handoffs, cycle rate and scrapes."""
    port = free_port() if name == "on" else 0
    scrapes: list[tuple[float, int]] = []
    async with ServerProcess("orchestrator", db, metrics_port=port) as orch:
        scraper = (
            asyncio.create_task(scraping(f"127.0.0.1:{port}", args.scrape_interval, scrapes))
            if port
            else None
        )
        try:
            handoffs = await measure_handoffs(
                orch.address, args.handoffs, args.warmup, args.settle_ms / 1000
            )
            cycles = await measure_cycles(
                orch, args.jobs, args.groups, args.cycle_warmup, args.window
            )
        finally:
            if scraper is not None:
                scraper.cancel()
                await asyncio.gather(scraper, return_exceptions=True)
    print(
        f"  {name:3} handoff p50 {statistics.median(handoffs.latency) * ms:7.3f} ms,"
        f" {cycles.per_second:7.0f} cycles/s, {len(scrapes)} scrapes",
        file=sys.stderr,
    )
    return handoffs.latency, cycles.per_second, scrapes


def measure_observe(handoffs: int, observed: bool) -> float:
    """Seconds of CPU per handoff (B's Acquire queued, A's Yield, B granted) of the
    lock table, with every event's effects observed or not."""
    from timeslice.metrics.orchestrator import OrchestratorMetrics
    from timeslice.orchestrator import events as ev
    from timeslice.orchestrator.state import LockTable

    table = LockTable()
    metrics = OrchestratorMetrics(
        lambda: ((g.name, len(g.queue)) for g in table.groups.values()), lambda: 0
    )
    groups = [f"g{i}" for i in range(OBSERVE_GROUPS)]
    t = 1.0

    def handle(event: Any) -> None:
        effects = table.handle(event)
        if observed:
            metrics.observe(event, effects)

    for group in groups:
        handle(ev.Acquire(now=t, group=group, job="a", call_id=f"{group}-a0"))
    holder, waiter = "a", "b"
    started = time.process_time()
    for i in range(handoffs // OBSERVE_GROUPS):
        t += 0.001
        for group in groups:
            handle(ev.Acquire(now=t, group=group, job=waiter, call_id=f"{group}-{waiter}{i}"))
            handle(ev.Yield(now=t, group=group, job=holder))
        holder, waiter = waiter, holder
    return (time.process_time() - started) / (handoffs // OBSERVE_GROUPS * OBSERVE_GROUPS)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    latency: dict[str, list[float]] = {name: [] for name in VARIANTS}
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    scrapes: list[tuple[float, int]] = []
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-metrics-") as tmp:
        for round_ in range(args.rounds):
            order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
            print(f"round {round_ + 1} of {args.rounds}:", file=sys.stderr)
            for name in order:
                samples, rate, seen = await run_variant(name, f"{tmp}/{name}-{round_}.db", args)
                latency[name] += samples
                rates[name].append(rate)
                scrapes += seen
    result: dict[str, Any] = {}
    for name in VARIANTS:
        result[name] = {
            "handoff_p50_ms": statistics.median(latency[name]) * ms,
            "handoff_p99_ms": percentile(latency[name], 0.99) * ms,
            "cycles_per_s": statistics.median(rates[name]),
            "cycles_per_s_rounds": rates[name],
        }
    off, on = result["off"], result["on"]
    result["handoff_p50_on_over_off"] = on["handoff_p50_ms"] / off["handoff_p50_ms"]
    result["handoff_p99_on_over_off"] = on["handoff_p99_ms"] / off["handoff_p99_ms"]
    result["cycles_off_over_on"] = off["cycles_per_s"] / on["cycles_per_s"]
    result["scrapes"] = len(scrapes)
    result["scrape_p50_ms"] = statistics.median(s for s, _ in scrapes) * ms if scrapes else None
    result["scrape_bytes_max"] = max((b for _, b in scrapes), default=0)
    plain = [measure_observe(args.observe_handoffs, False) for _ in range(args.rounds)]
    fed = [measure_observe(args.observe_handoffs, True) for _ in range(args.rounds)]
    result["observe"] = {
        "handoffs": args.observe_handoffs,
        "table_us_per_handoff": statistics.median(plain) * 1e6,
        "observed_us_per_handoff": statistics.median(fed) * 1e6,
    }
    result["observe"]["added_us_per_handoff"] = (
        result["observe"]["observed_us_per_handoff"] - result["observe"]["table_us_per_handoff"]
    )
    result["target"] = TARGET
    result["parameters"] = {
        "rounds": args.rounds,
        "handoffs_per_round": args.handoffs,
        "warmup": args.warmup,
        "settle_ms": args.settle_ms,
        "jobs": args.jobs,
        "groups": args.groups,
        "cycle_warmup_s": args.cycle_warmup,
        "window_s": args.window,
        "scrape_interval_s": args.scrape_interval,
        "journal": "sqlite file in a temp dir, WAL, synchronous=FULL",
    }
    result["machine"] = machine()
    return result


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice metrics cost: {describe(r['machine'])}")
    print(
        f"{p['rounds']} round(s) of each variant, alternating; {p['handoffs_per_round']} handoffs"
        f" and a {p['window_s']:g} s cycle window ({p['jobs']} jobs, {p['groups']} groups) each;"
        f" /metrics scraped every {p['scrape_interval_s']:g} s with metrics on"
        f" ({r['scrapes']} scrapes, p50 {r['scrape_p50_ms'] or 0:.2f} ms,"
        f" up to {r['scrape_bytes_max'] / 1024:.0f} KiB); journal: {p['journal']}"
    )
    print()
    print(format_table(summary(r)))
    o = r["observe"]
    print(
        f"lock table alone {o['table_us_per_handoff']:.1f} us of CPU per handoff; with every"
        f" effect observed {o['observed_us_per_handoff']:.1f} us"
        f" (+{o['added_us_per_handoff']:.1f} us, {o['handoffs']} handoffs in"
        f" {OBSERVE_GROUPS} groups)"
    )
    for key, label in [
        ("handoff_p50_on_over_off", "handoff p50, on / off"),
        ("handoff_p99_on_over_off", "handoff p99, on / off"),
        ("cycles_off_over_on", "cycles per second, off / on"),
    ]:
        verdict = "met" if r[key] <= r["target"] else "not met"
        print(f"{label:40} {r[key]:6.3f}x  (target <= {r['target']:g}x: {verdict})")


def summary(r: dict[str, Any]) -> list[Row]:
    """The suite's rows: the orchestrator with metrics against the one without."""
    off, on = r["off"], r["on"]
    note = "baseline: the same run with metrics off"
    return [
        Row("handoff p50, metrics on and scraped", on["handoff_p50_ms"], off["handoff_p50_ms"],
            "ms", note),
        Row("handoff p99, metrics on and scraped", on["handoff_p99_ms"], off["handoff_p99_ms"],
            "ms", note),
        Row("acquire/yield cycles per second, metrics on", on["cycles_per_s"],
            off["cycles_per_s"], "/s", note),
    ]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant")
    parser.add_argument("--handoffs", type=int, default=300, help="measured handoffs per run")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured handoffs first")
    parser.add_argument(
        "--settle-ms", type=float, default=5.0, help="pause after B is queued, before A yields"
    )
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the throughput run")
    parser.add_argument("--groups", type=int, default=10, help="groups in the throughput run")
    parser.add_argument("--cycle-warmup", type=float, default=1.0, help="seconds before counting")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of counted cycles")
    parser.add_argument(
        "--observe-handoffs", type=int, default=20_000, help="handoffs of the in-process run"
    )
    parser.add_argument(
        "--scrape-interval", type=float, default=1.0, help="seconds between scrapes (on)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.handoffs, args.warmup = 1, min(args.handoffs, 60), min(args.warmup, 10)
        args.cycle_warmup, args.window = min(args.cycle_warmup, 0.5), min(args.window, 1.5)
        args.observe_handoffs = min(args.observe_handoffs, 2000)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
