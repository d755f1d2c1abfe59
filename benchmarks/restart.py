"""Restart time against journal length: what the snapshots save a start.

    python benchmarks/restart.py --json OUT [--events 1000 10000 100000] [--quick]

The journals are written here with the journal API, as an orchestrator writes
them: first the events of its start (hold limit, policy, Recover), then jobs
taking turns on their groups (`--jobs` jobs in `--groups` groups: each Yield
grants the next in line, and the job that yielded queues again), appended
`--batch` events per commit, with a snapshot of the table (`LockTable.to_dict`)
after the batch that brings the events since the start or the last snapshot to
1,000, the orchestrator's default `snapshot_every`. So the newest snapshot of a
journal of 10,000 events is at event 9,003: a start folds 997 events after it,
about the most it ever folds (none of 1,000 events is a snapshot yet).

For each length, side by side: an `Orchestrator(db=...)` started on a fresh copy
of that journal, timed from `start()` until it serves (journal opened, table
rebuilt, its start events journaled, listening), against a start on the same
events without any snapshot (as `snapshot_every` set very large leaves a
journal; the start also runs with it, so that it writes none either), which
folds every event. Median of `--trials` starts each, alternating the two.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
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
    ms,
    run_main,
)
from timeslice.orchestrator import events as ev  # noqa: E402
from timeslice.orchestrator.journal import open_journal  # noqa: E402
from timeslice.orchestrator.server import Orchestrator, OrchestratorConfig  # noqa: E402
from timeslice.orchestrator.state import LockTable  # noqa: E402

SNAPSHOT_EVERY = OrchestratorConfig.snapshot_every  # the default: 1000
NEVER = 10**12  # snapshot_every for "no snapshots"


def start_events() -> list[ev.Event]:
    """What an orchestrator journals when it starts with its defaults."""
    now = time.time()
    return [ev.SetHoldLimit(now=now, group="", max_hold=None, grace=0.0), ev.SetPolicy(now=now, group="", policy="fifo", aging=60.0),
            ev.Recover(now=now, grace=30.0)]  # fmt: skip


def turns(jobs: int, groups: int) -> Iterator[ev.Event]:
    """`jobs` jobs in `groups` groups taking turns: everyone asks (one holder per
    group, the others queue); then, group after group, the holder yields (the next
    in line is granted) and asks again (it queues)."""
    members = [[f"job-{j:05d}" for j in range(g, jobs, groups)] for g in range(groups)]
    calls = 0
    now = time.time()
    for g, names in enumerate(members):
        for job in names:
            calls += 1
            yield ev.Acquire(now=now, group=f"group-{g:04d}", job=job, call_id=f"1.{calls}")
    turn = 0
    while True:
        for g, names in enumerate(members):
            holder = names[turn % len(names)]
            now = time.time()
            yield ev.Yield(now=now, group=f"group-{g:04d}", job=holder)
            calls += 1
            yield ev.Acquire(now=now, group=f"group-{g:04d}", job=holder, call_id=f"1.{calls}")
        turn += 1


async def build(path: Path, length: int, args: argparse.Namespace) -> int:
    """A journal of `length` events at `path`, with a snapshot of the table after the
    batch that brings the events since the start (or the last snapshot) to 1,000;
    returns the newest snapshot's sequence number (0: none)."""
    journal = open_journal(f"sqlite:///{path}")
    await journal.open()
    table, events = LockTable(), turns(args.jobs, args.groups)
    newest = since = 0
    try:
        batch = start_events()
        while batch:
            for event in batch:
                table.handle(event)
            seq = await journal.append(batch)
            if since >= SNAPSHOT_EVERY:
                await journal.save_snapshot(seq, table.to_dict())
                since, newest = 0, seq
            batch = [next(events) for _ in range(min(args.batch, length - seq))]
            since += len(batch)
    finally:
        await journal.close()  # the last connection: the WAL is folded into the file
    return newest


async def start_once(source: Path, directory: Path, snapshot_every: int) -> float:
    """Seconds from `start()` to serving, on a fresh copy of `source`."""
    copy = directory / "trial.db"
    shutil.copyfile(source, copy)
    orch = Orchestrator(db=f"sqlite:///{copy}", port=0, snapshot_every=snapshot_every)
    t0 = time.perf_counter()
    await orch.start()
    took = time.perf_counter() - t0
    await orch.close()
    copy.unlink()
    for leftover in directory.glob("trial.db-*"):  # -wal, -shm
        leftover.unlink()
    return took


async def run(args: argparse.Namespace) -> dict[str, Any]:
    points = []
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        directory = Path(tmp)
        empty = directory / "empty.db"
        empty.touch()  # the orchestrator creates the tables
        floor = []
        await start_once(empty, directory, SNAPSHOT_EVERY)  # unmeasured: the first start
        for _ in range(args.trials):
            floor.append(await start_once(empty, directory, SNAPSHOT_EVERY))
        for length in sorted(args.events):
            with_snapshots = directory / f"{length}.db"
            newest = await build(with_snapshots, length, args)
            without = directory / f"{length}-no-snapshots.db"
            shutil.copyfile(with_snapshots, without)
            db = sqlite3.connect(without)
            with db:
                db.execute("DELETE FROM snapshots")
            db.close()
            trials = args.trials if length <= 10_000 else max(3, args.trials // 2)
            snapshots, none = [], []
            for _ in range(trials):
                snapshots.append(await start_once(with_snapshots, directory, SNAPSHOT_EVERY))
                none.append(await start_once(without, directory, NEVER))
            points.append(
                {
                    "events": length,
                    "journal_bytes": with_snapshots.stat().st_size,
                    "newest_snapshot_seq": newest,
                    "folded_with_snapshots": length - newest,
                    "start_with_snapshots_ms": statistics.median(snapshots) * ms,
                    "start_without_snapshots_ms": statistics.median(none) * ms,
                    "trials": trials,
                }
            )
            print(
                f"  {length} events: {points[-1]['start_with_snapshots_ms']:.0f} ms with "
                f"snapshots, {points[-1]['start_without_snapshots_ms']:.0f} ms without",
                flush=True,
            )
        where = filesystem(tmp)
    return {
        "points": points,
        "start_empty_ms": statistics.median(floor) * ms,
        "filesystem": where,
        "parameters": {
            "events": args.events,
            "jobs": args.jobs,
            "groups": args.groups,
            "batch": args.batch,
            "trials": args.trials,
            "snapshot_every": SNAPSHOT_EVERY,
            "quick": args.quick,
        },
        "machine": machine(),
    }


def summary(r: dict[str, Any]) -> list[Row]:
    """Per length: the start against the same start without snapshots, and against
    a start on an empty journal."""
    rows = []
    every = r["parameters"]["snapshot_every"]
    for p in r["points"]:
        folded = p["folded_with_snapshots"]
        also = " and writes a snapshot as it starts" if folded >= every else ""
        rows.append(
            Row(f"restart on {p['events']:,} events, a snapshot every {every:,}",
                p["start_with_snapshots_ms"], p["start_without_snapshots_ms"], "ms",
                f"baseline: the same events without snapshots (snapshot_every very large: "
                f"folds all {p['events']:,}); ours folds {folded:,}{also}")
        )  # fmt: skip
        rows.append(
            Row(f"restart on {p['events']:,} events, snapshots, against an empty journal",
                p["start_with_snapshots_ms"], r["start_empty_ms"], "ms",
                "baseline: a start on an empty journal")
        )  # fmt: skip
    return rows


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice restart benchmark: {describe(r['machine'])}")
    print(
        f"{p['jobs']} jobs in {p['groups']} groups, {p['batch']} events per commit, "
        f"files on {r['filesystem']}\n"
    )
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument(
        "--events", type=int, nargs="+", default=[1000, 10_000, 100_000], help="journal lengths"
    )
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the journal")
    parser.add_argument("--groups", type=int, default=10, help="groups in the journal")
    parser.add_argument("--batch", type=int, default=100, help="events per append")
    parser.add_argument("--trials", type=int, default=5, help="starts of each journal")
    args = parser.parse_args(argv)
    if args.quick:
        args.events = [n for n in args.events if n <= 10_000] or [min(args.events)]
        args.trials = min(args.trials, 3)
    if min(args.events) < 3 or args.jobs < args.groups or args.groups < 1 or args.trials < 1:
        parser.error("--events at least 3, --groups positive and at most --jobs")
    if args.batch < 1:
        parser.error("--batch must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
