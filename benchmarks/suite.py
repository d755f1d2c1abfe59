"""The benchmark suite: every benchmark of this folder, one table.

    python -m benchmarks [--quick] [--only NAME ...] [--out DIR]
    timeslice bench [--quick] [--only NAME ...] [--out DIR]

Runs each benchmark as `python benchmarks/NAME.py --json ...` in a process of its
own (so that each starts from a fresh interpreter and stops every process it
started, even when it fails or runs out of time), one after the other, then
writes to DIR (default: benchmarks/results):

  latest.json  every benchmark's full results, and the table's rows;
  latest.md    the table (also printed): each figure beside a baseline measured
               in the same run, and their ratio;
  latest.log   what each benchmark printed.

A full run takes about fourteen minutes on two cores, `--quick` about three; a
benchmark that runs past its own time limit, or past the suite's (`--limit`:
18 minutes), is stopped and reported as failed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import (  # noqa: E402
    ROOT,
    Row,
    describe,
    format_table,
    machine,
    stop_on_sigterm,
    write_json,
)

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    name: str
    what: str
    timeout: float  # seconds, full run
    quick_timeout: float  # seconds, with --quick
    args: tuple[str, ...] = ()  # beyond --json and --quick


BENCHMARKS = (
    Benchmark("handoff", "handoff latency against an echo round trip", 180, 60),
    Benchmark("switch", "a switch through two agents against an echo and a handoff", 240, 90),
    Benchmark("cycles", "acquire/yield cycles per second, 10 to 10,000 jobs", 300, 120),
    Benchmark("journal", "a durable journal append against a raw SQLite commit", 120, 60),
    Benchmark("restart", "restart time against journal length, with and without snapshots",
              240, 90),
    Benchmark("agent", "snapshot/restore bandwidth against a plain copy", 180, 60),
    Benchmark("demo", "the demo's simulated RL jobs, time-sliced against back to back",
              240, 60),
    Benchmark("watchers", "acquire/yield latency with 4,000 Watch streams open against none",
              240, 150),
    Benchmark("secure", "handoff and cycles with TLS and tokens against the same without",
              300, 90, ("--rounds", "2")),
    Benchmark("syscalls", "socket writes per unary call against grpclib's own (strace)", 90, 60),
    Benchmark("header_blocks", "reading a call's header blocks against hpack's decoder", 60, 30),
    Benchmark("standby", "handoff with two standbys against an active alone (PostgreSQL)",
              180, 60),
    Benchmark("anchors", "handoff and 100-job cycles against etcd's v3lock and Redis",
              480, 210),
    Benchmark("stacks", "server CPU per unary call: grpclib against grpcio's servers, uvloop",
              180, 60),
    Benchmark("pipeline", "a switch tag by tag against one moved whole, on a GPU (model)",
              30, 30),
)  # fmt: skip
NAMES = tuple(b.name for b in BENCHMARKS)


@dataclass
class Outcome:
    name: str
    command: list[str]
    wall_s: float
    result: dict[str, Any] | None = None
    error: str | None = None


def run_one(bench: Benchmark, quick: bool, log: Any, deadline: float) -> Outcome:
    """Run one benchmark in a process (and session) of its own; stop it (and every
    process it started) on a timeout, at `deadline` (time.monotonic) or on an
    interrupt."""
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        out = Path(tmp) / f"{bench.name}.json"
        command = [sys.executable, str(HERE / f"{bench.name}.py"), "--json", str(out),
                   *bench.args, *(["--quick"] if quick else [])]  # fmt: skip
        timeout = min(bench.quick_timeout if quick else bench.timeout, deadline - time.monotonic())
        if timeout <= 0:
            print(f"{bench.name:8} skipped: the suite's time limit is spent", flush=True)
            return Outcome(bench.name, command, 0.0, error="skipped: the suite's time limit")
        print(f"{bench.name:8} {bench.what} ...", end="", flush=True)
        log.write(f"\n===== {bench.name}: {' '.join(command)}\n")
        log.flush()
        started = time.monotonic()
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        error = None
        try:
            rc = child.wait(timeout)
            if rc != 0:
                error = f"exited with status {rc}"
            if leftovers(child.pid):
                log.write(f"===== {bench.name}: processes left in its session were killed\n")
        except subprocess.TimeoutExpired:
            error = f"stopped after {timeout:.0f} s (its time limit, or the suite's)"
            stop(child)
        except BaseException:
            stop(child)
            print(" interrupted", flush=True)
            raise
        outcome = Outcome(bench.name, command, time.monotonic() - started, error=error)
        if error is None:
            try:
                outcome.result = json.loads(out.read_text())
            except (OSError, ValueError) as exc:
                outcome.error = f"no results: {exc}"
    print(f" {'ok' if outcome.error is None else 'FAILED: ' + outcome.error}"
          f" ({outcome.wall_s:.0f} s)", flush=True)  # fmt: skip
    return outcome


def leftovers(group: int, grace: float = 3.0) -> bool:
    """Whether processes of the process group `group` outlived its leader for
    `grace` seconds (they are killed then)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return False
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
            return True
        time.sleep(0.05)


def stop(child: subprocess.Popen[bytes]) -> None:
    """Ask the benchmark to stop (it stops what it started), then kill what is left
    of its session."""
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(5)


def rows_of(outcome: Outcome) -> list[Row]:
    """The rows a benchmark adds to the table (its module's `summary`)."""
    if outcome.result is None:
        return []
    module = importlib.import_module(f"benchmarks.{outcome.name}")
    rows: list[Row] = module.summary(outcome.result)
    return rows


def commit() -> str:
    """The checkout's commit, and whether it has local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, check=True,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" with local changes" if dirty else "")


def markdown(rows: list[tuple[str, Row]], outcomes: list[Outcome], header: dict[str, Any]) -> str:
    mode = "quick run (--quick)" if header["quick"] else "full run"
    lines = [
        "# timeslice benchmarks",
        "",
        f"{header['started']}, commit {header['commit']}, {mode}, {header['wall_s']:.0f} s; "
        f"{describe(header['machine'])}.",
        "",
        "Ratio = ours / baseline. Every baseline was measured in the same run as its "
        "figure, side by side; latencies are medians (p50) unless p99 is named.",
        "",
        format_table([row for _, row in rows]),
    ]
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        lines += ["", "Failed (see latest.log):", ""]
        lines += [f"- {o.name}: {o.error}" for o in failed]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (about 1 min)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only this benchmark (repeatable, or comma-separated): {', '.join(NAMES)}",
    )
    parser.add_argument(
        "--out", type=Path, default=HERE / "results", help="where latest.{json,md,log} go"
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=None,
        help="seconds the whole suite may take; a benchmark still running then is stopped"
        " and the rest skipped (default: 1080, or 300 with --quick)",
    )
    args = parser.parse_args(argv)
    if args.limit is None:
        args.limit = 300.0 if args.quick else 1080.0
    only = [name.strip() for value in args.only or [] for name in value.split(",") if name.strip()]
    if unknown := [name for name in only if name not in NAMES]:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    args.only = only
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()
    selected = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    try:
        with (args.out / "latest.log").open("w") as log:
            deadline = t0 + args.limit
            for bench in selected:
                outcomes.append(run_one(bench, args.quick, log, deadline))
    except KeyboardInterrupt:
        print("interrupted; every process started is stopped", file=sys.stderr)
        return 130
    header = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "quick": args.quick,
        "only": args.only,
        "wall_s": time.monotonic() - t0,
        "machine": machine(),
    }
    rows: list[tuple[str, Row]] = []
    for outcome in outcomes:
        try:
            rows += [(outcome.name, row) for row in rows_of(outcome)]
        except Exception as exc:  # a result without the keys its table needs
            outcome.error = f"its results do not make a table: {exc!r}"
    text = markdown(rows, outcomes, header)
    (args.out / "latest.md").write_text(text)
    write_json(
        args.out / "latest.json",
        {
            **header,
            "table": [{"benchmark": name, **row.to_dict()} for name, row in rows],
            "benchmarks": {
                o.name: {
                    "command": o.command,
                    "wall_s": o.wall_s,
                    "error": o.error,
                    "result": o.result,
                }
                for o in outcomes
            },
        },
    )
    print()
    print(text)
    print(f"written: {args.out / 'latest.md'}, {args.out / 'latest.json'}, "
          f"{args.out / 'latest.log'}")  # fmt: skip
    return 1 if any(o.error is not None for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
