"""Journal size: the SQLite journal's files after many acquire/yield cycles.

    python benchmarks/journal_size.py --json OUT [--cycles 100000] [--quick]

An in-process Orchestrator on an SQLite file (WAL, synchronous=FULL, a snapshot
every 1000 events, as served) runs `acquire` then `yield_` of one job on one
group, `--cycles` times: two journaled events a cycle. Once with the default
retention (events stay a day after a snapshot covers them: here all of them) and
once with retention 0 (they go with the next snapshot). Reported: the database
file, its -wal, and the rows left, after the orchestrator closed.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import Row, add_common_arguments, format_table, run_main  # noqa: E402
from timeslice.orchestrator.journal import DEFAULT_RETENTION  # noqa: E402
from timeslice.orchestrator.server import Orchestrator  # noqa: E402

MiB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--cycles", type=int, default=100_000)
    args = parser.parse_args(argv)
    if args.quick:
        args.cycles = min(args.cycles, 5_000)
    return args


def sizes(path: Path) -> dict[str, Any]:
    wal = Path(f"{path}-wal")
    with closing(sqlite3.connect(path)) as conn:
        events, first = conn.execute("SELECT count(*), min(seq) FROM events").fetchone()
        snapshots = conn.execute("SELECT count(*) FROM snapshots").fetchone()[0]
    return {
        "db_bytes": path.stat().st_size,
        "wal_bytes": wal.stat().st_size if wal.exists() else 0,
        "events": events,
        "first_seq": first,
        "snapshots": snapshots,
    }


async def cycles(path: Path, retention: float, count: int) -> dict[str, Any]:
    started = time.perf_counter()
    async with Orchestrator(db=str(path), journal_retention=retention) as orch:
        for _ in range(count):
            await orch.acquire("g", "job-a")
            await orch.yield_("g", "job-a")
        during = sizes(path)
    return {
        "retention_s": retention,
        "cycles": count,
        "seconds": time.perf_counter() - started,
        "while_serving": during,
        "closed": sizes(path),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for name, retention in (("default", DEFAULT_RETENTION), ("zero", 0.0)):
            runs.append({"name": name, **await cycles(Path(tmp) / f"{name}.db", retention,
                                                      args.cycles)})  # fmt: skip
    return {"runs": runs}


def summary(result: dict[str, Any]) -> list[Row]:
    default, zero = result["runs"]
    total = [r["closed"]["db_bytes"] + r["closed"]["wal_bytes"] for r in (default, zero)]
    return [
        Row(f"journal after {zero['cycles']:,} cycles, retention 0", total[1] / MiB,
            total[0] / MiB, "MiB", "baseline: the default retention (a day: every event kept)"),
    ]  # fmt: skip


def print_table(result: dict[str, Any]) -> None:
    print("| retention | cycles | db MiB | wal MiB | events left | snapshots | s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in result["runs"]:
        c = r["closed"]
        print(f"| {r['retention_s']:g} s | {r['cycles']:,} | {c['db_bytes'] / MiB:.2f} |"
              f" {c['wal_bytes'] / MiB:.2f} | {c['events']:,} | {c['snapshots']} |"
              f" {r['seconds']:.0f} |")  # fmt: skip
    print()
    print(format_table(summary(result)))


if __name__ == "__main__":
    sys.exit(run_main(parse_args(), run, print_table))
