"""Journal commit cost: one durable append against a raw SQLite commit.

    python benchmarks/journal.py --json OUT [--appends 3000] [--quick]

In one process, interleaved in blocks so that all three share the machine's load:

  sqlite    the orchestrator's journal (`open_journal("sqlite:///PATH")`, WAL,
            synchronous=FULL as it configures them): `append([event])` of one
            Acquire event, as a grant waits for it: its JSON, the hop to the
            journal's thread, BEGIN IMMEDIATE, INSERT, COMMIT (fsync) and back.
  raw       the floor: Python's sqlite3 on a file in the same directory with the
            same settings and table, BEGIN IMMEDIATE, INSERT of the same row
            (its JSON made beforehand), COMMIT, in this thread.
  memory    the memory journal's `append([event])` (nothing durable).

Each append is timed on its own; p50 and p99 are reported.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import (  # noqa: E402
    Row,
    add_common_arguments,
    describe,
    filesystem,
    format_table,
    machine,
    run_main,
    stats,
)
from timeslice.orchestrator import events as ev  # noqa: E402
from timeslice.orchestrator.journal import Journal, open_journal  # noqa: E402

KINDS = ("sqlite", "raw", "memory")


def event(i: int) -> ev.Acquire:
    """The i-th event: an Acquire, as most appends carry."""
    return ev.Acquire(
        now=time.time(), group=f"group-{i % 10:04d}", job=f"job-{i % 100:05d}", call_id=f"1.{i}"
    )


class RawSqlite:
    """The floor: one insert and commit on a plain sqlite3 connection."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, ts FLOAT NOT NULL, "
            "kind VARCHAR(64) NOT NULL, payload TEXT NOT NULL)"
        )
        self.seq = 0

    def append(self, kind: str, payload: str) -> None:
        self.seq += 1
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute(
            "INSERT INTO events (seq, ts, kind, payload) VALUES (?, ?, ?, ?)",
            (self.seq, time.time(), kind, payload),
        )
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        sql: Journal = open_journal(f"sqlite:///{tmp}/journal.db")
        memory: Journal = open_journal("memory")
        raw = RawSqlite(f"{tmp}/raw.db")
        await sql.open()
        try:
            where = filesystem(tmp)
            count = 0

            async def timed_sql() -> float:
                e = event(count)
                t0 = time.perf_counter()
                await sql.append([e])
                return time.perf_counter() - t0

            async def timed_memory() -> float:
                e = event(count)
                t0 = time.perf_counter()
                await memory.append([e])
                return time.perf_counter() - t0

            async def timed_raw() -> float:
                e = event(count)
                payload = json.dumps(ev.event_to_dict(e))
                t0 = time.perf_counter()
                raw.append(type(e).__name__, payload)
                return time.perf_counter() - t0

            timers: dict[str, Callable[[], Coroutine[Any, Any, float]]] = {
                "sqlite": timed_sql,
                "raw": timed_raw,
                "memory": timed_memory,
            }
            for kind in KINDS:  # warm up, unmeasured
                for _ in range(args.warmup):
                    await timers[kind]()
            done = 0
            while done < args.appends:
                block = min(args.block, args.appends - done)
                for kind in KINDS:
                    for _ in range(block):
                        count += 1
                        times[kind].append(await timers[kind]())
                done += block
        finally:
            raw.close()
            await sql.close()
            await memory.close()
    result: dict[str, Any] = {}
    for kind in KINDS:
        result.update(stats(kind, times[kind]))
    result.update(
        sqlite_over_raw_p50=result["sqlite_p50_ms"] / result["raw_p50_ms"],
        sqlite_over_memory_p50=result["sqlite_p50_ms"] / result["memory_p50_ms"],
        filesystem=where,
        parameters={
            "appends": args.appends,
            "block": args.block,
            "warmup": args.warmup,
            "quick": args.quick,
            "sqlite": "WAL, synchronous=FULL, a file in a temp dir",
        },
        machine=machine(),
    )
    return result


def summary(r: dict[str, Any]) -> list[Row]:
    n = r["parameters"]["appends"]
    raw = f"baseline: sqlite3 insert + commit, same settings, same disk ({r['filesystem']})"
    return [
        Row("journal append p50, 1 event, SQLite on disk", r["sqlite_p50_ms"], r["raw_p50_ms"],
            "ms", f"{raw}; {n} appends each"),
        Row("journal append p99, 1 event, SQLite on disk", r["sqlite_p99_ms"], r["raw_p99_ms"],
            "ms", raw),
        Row("journal append p50, SQLite against the memory journal", r["sqlite_p50_ms"],
            r["memory_p50_ms"], "ms",
            f"baseline: the memory journal's append (p99 {r['memory_p99_ms']:.3f} ms)"),
    ]  # fmt: skip


def print_table(r: dict[str, Any]) -> None:
    print(f"timeslice journal benchmark: {describe(r['machine'])}")
    print(f"files on {r['filesystem']}\n")
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--appends", type=int, default=3000, help="measured appends of each")
    parser.add_argument("--block", type=int, default=50, help="appends of each per block")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured appends of each")
    args = parser.parse_args(argv)
    if args.quick:
        args.appends, args.warmup = min(args.appends, 300), min(args.warmup, 20)
    if args.appends < 1 or args.block < 1 or args.warmup < 0:
        parser.error("--appends and --block must be positive, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
