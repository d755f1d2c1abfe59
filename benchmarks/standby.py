"""Handoff latency on a PostgreSQL journal: an active with two standbys against an
active alone.

    python benchmarks/standby.py --json OUT [--postgres URL] [--quick]

Two orchestrators journal to two databases of one PostgreSQL server, each with a
leader lease (`--leader-lease`, 5 s by default): `alone` is the only candidate
on its database; `with standbys` has two more `timeslice serve orchestrator`
processes waiting on its database, as standbys do (each reads the lease row
every third of the lease). Blocks of handoffs (A sends Yield -> B's blocked
Acquire returns, as in `handoff.py`) alternate between the two, so that both
share the machine's and the database's load; the p50 and p99 of every handoff
of each side are reported, and their ratio.

The server is `--postgres` (default: TIMESLICE_TEST_POSTGRES_URL); the benchmark
makes its two databases there and drops them at the end. Without a server it
says so and reports nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from grpclib.exceptions import GRPCError  # noqa: E402

from benchmarks.common import (  # noqa: E402
    ROOT,
    Row,
    ServerProcess,
    add_common_arguments,
    channel,
    describe,
    free_port,
    machine,
    ms,
    percentile,
    run_main,
)
from benchmarks.handoff import measure_handoffs  # noqa: E402
from tests.postgres import scratch_database  # noqa: E402
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb  # noqa: E402

SIDES = ("alone", "with_standbys")
STANDBYS = 2


async def role_of(address: str) -> str:
    async with channel(address) as ch:
        stub = pb.TimeSliceOrchestratorServiceStub(ch, timeout=2)
        return (await stub.get_leadership(pb.GetLeadershipRequest())).role


@contextlib.asynccontextmanager
async def standbys(url: str, lease: float, count: int) -> Any:
    """`count` `timeslice serve orchestrator` processes on `url`, each a standby."""
    ports = [free_port() for _ in range(count)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "timeslice", "serve", "orchestrator", "--db", url,
             "--port", str(port), "--leader-lease", str(lease)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]  # fmt: skip
    try:
        for port, child in zip(ports, children, strict=True):
            for _ in range(300):
                assert child.poll() is None, "a standby exited"
                with contextlib.suppress(OSError, GRPCError, TimeoutError):
                    if await role_of(f"127.0.0.1:{port}") == "standby":
                        break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("a standby did not start")
        yield ports
    finally:
        for child in children:
            child.terminate()
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(10)
            if child.poll() is None:
                child.kill()
                child.wait()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.postgres:
        print("no PostgreSQL server (--postgres or TIMESLICE_TEST_POSTGRES_URL): skipped")
        return {"skipped": "no PostgreSQL server", "machine": machine()}
    latency: dict[str, list[float]] = {side: [] for side in SIDES}
    options = {"leader_lease": args.leader_lease}
    async with (
        scratch_database(args.postgres, "timeslice_bench_alone") as alone_url,
        scratch_database(args.postgres, "timeslice_bench_standbys") as standby_url,
        ServerProcess("orchestrator", alone_url, **options) as alone,
        ServerProcess("orchestrator", standby_url, **options) as active,
        standbys(standby_url, args.leader_lease, STANDBYS),
    ):
        assert await role_of(alone.address) == await role_of(active.address) == "active"
        addresses = {"alone": alone.address, "with_standbys": active.address}
        for block in range(args.blocks):
            # Alternate which side goes first, so that neither always follows the other.
            for side in SIDES if block % 2 == 0 else reversed(SIDES):
                handoffs = await measure_handoffs(
                    addresses[side], args.handoffs, args.warmup, args.settle_ms / 1000
                )
                latency[side] += handoffs.latency
    result: dict[str, Any] = {}
    for side in SIDES:
        result[f"{side}_p50_ms"] = statistics.median(latency[side]) * ms
        result[f"{side}_p99_ms"] = percentile(latency[side], 0.99) * ms
    result["p50_ratio"] = result["with_standbys_p50_ms"] / result["alone_p50_ms"]
    result["p99_ratio"] = result["with_standbys_p99_ms"] / result["alone_p99_ms"]
    result["target_ratio"] = 1.2
    result["parameters"] = {
        "blocks": args.blocks,
        "handoffs_per_block": args.handoffs,
        "warmup": args.warmup,
        "settle_ms": args.settle_ms,
        "leader_lease_s": args.leader_lease,
        "standbys": STANDBYS,
        "journal": "PostgreSQL (asyncpg), a database per side, on one server",
    }
    result["machine"] = machine()
    return result


def print_table(r: dict[str, Any]) -> None:
    if "skipped" in r:
        return
    p = r["parameters"]
    print(f"timeslice standby benchmark: {describe(r['machine'])}")
    print(
        f"journal: {p['journal']}; leader lease {p['leader_lease_s']:g} s;"
        f" {p['blocks']} blocks of {p['handoffs_per_block']} handoffs per side, alternating"
    )
    print()
    print(f"{'':50} {'p50 ms':>8} {'p99 ms':>8}")
    for label, side in (
        ("handoff, the only candidate", "alone"),
        (f"handoff, the active of 1 + {p['standbys']} standbys", "with_standbys"),
    ):
        print(f"{label:50} {r[side + '_p50_ms']:8.3f} {r[side + '_p99_ms']:8.3f}")
    verdict = "met" if r["p50_ratio"] <= r["target_ratio"] else "not met"
    print(
        f"{'with standbys / alone':50} {r['p50_ratio']:7.2f}x {r['p99_ratio']:7.2f}x"
        f"  (target p50 <= {r['target_ratio']:g}x: {verdict})"
    )


def summary(r: dict[str, Any]) -> list[Row]:
    """The suite's rows: the handoff with standbys beside the handoff alone."""
    if "skipped" in r:
        return []
    note = f"baseline: the same handoff with no standby; PostgreSQL journal, lease {r['parameters']['leader_lease_s']:g} s"
    return [
        Row("handoff p50, active with 2 standbys", r["with_standbys_p50_ms"],
            r["alone_p50_ms"], "ms", note),
        Row("handoff p99, active with 2 standbys", r["with_standbys_p99_ms"],
            r["alone_p99_ms"], "ms", note),
    ]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument(
        "--postgres",
        default=os.environ.get("TIMESLICE_TEST_POSTGRES_URL", ""),
        help="a PostgreSQL server's URL (default: TIMESLICE_TEST_POSTGRES_URL)",
    )
    parser.add_argument("--blocks", type=int, default=6, help="blocks per side, alternating")
    parser.add_argument("--handoffs", type=int, default=100, help="measured handoffs per block")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured handoffs per block")
    parser.add_argument(
        "--settle-ms", type=float, default=5.0, help="pause after B is queued, before A yields"
    )
    parser.add_argument("--leader-lease", type=float, default=5.0, help="seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.blocks, args.handoffs, args.warmup = min(args.blocks, 2), min(args.handoffs, 30), 5
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
