"""The demo's simulation: what time-slicing buys simulated RL jobs.

    python benchmarks/demo.py --json OUT [--jobs 2] [--steps 6] [--step-seconds 1] [--quick]

Runs `timeslice.demo.run_demo` (an orchestrator and an agent in this process,
SQLite journals; each job a loop of steps whose phases follow a recorded RL run,
its context a real host-memory workload moved out and back at every switch):
the same jobs back to back, then time-sliced, on fresh servers each time. The
figures: the time-sliced wall time against the back-to-back one (the speedup is
their inverse), the accelerator's busy share in each, and the median switch
(grant decided -> contexts moved, from the orchestrator's Watch) against a
plain numpy copy of as many bytes in this process.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import (  # noqa: E402
    Row,
    add_common_arguments,
    describe,
    format_table,
    machine,
    memcpy_gbps,
    ms,
    run_main,
)
from timeslice.demo import DemoConfig, RoundResult, run_demo  # noqa: E402


def round_figures(r: RoundResult) -> dict[str, Any]:
    return {
        "wall_s": r.wall_s,
        "busy_s": r.busy_s,
        "busy_share": r.busy_share,
        "switches": len(r.switch_s),
        "switch_p50_ms": statistics.median(r.switch_s) * ms if r.switch_s else None,
        "bytes_moved": r.bytes_moved,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = DemoConfig(args.jobs, args.steps, args.step_seconds, args.mib, args.profile)
    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        demo = await run_demo(config, Path(tmp), out)
    shared = demo.time_sliced
    result: dict[str, Any] = {
        "back_to_back": round_figures(demo.back_to_back),
        "time_sliced": round_figures(shared),
        "speedup": demo.speedup,
        "output": out.getvalue(),
    }
    if shared.switch_s and shared.bytes_moved:
        per_switch = shared.bytes_moved // len(shared.switch_s)
        copy = memcpy_gbps(per_switch, 5)
        result.update(bytes_per_switch=per_switch, memcpy_gbps=copy,
                      memcpy_ms=per_switch / copy / 1e9 * ms)  # fmt: skip
    result.update(
        parameters={
            "jobs": args.jobs,
            "steps": args.steps,
            "step_seconds": args.step_seconds,
            "mib": args.mib,
            "profile": args.profile,
            "quick": args.quick,
        },
        machine=machine(),
    )
    return result


def summary(r: dict[str, Any]) -> list[Row]:
    p, a, b = r["parameters"], r["back_to_back"], r["time_sliced"]
    what = f"{p['jobs']} jobs x {p['steps']} steps of {p['step_seconds']:g} s ({p['profile']})"
    rows = [
        Row(f"demo wall time, time-sliced: {what}", b["wall_s"], a["wall_s"], "s",
            f"baseline: the same jobs back to back; speedup {r['speedup']:.2f}x"),
        Row("demo accelerator busy share, time-sliced", 100 * b["busy_share"],
            100 * a["busy_share"], "%", "baseline: the same jobs back to back"),
    ]  # fmt: skip
    if b["switch_p50_ms"] is not None and "memcpy_ms" in r:
        mib = r["bytes_per_switch"] / 1024**2
        rows.append(
            Row("demo switch p50: grant decided -> contexts moved", b["switch_p50_ms"],
                r["memcpy_ms"], "ms",
                f"baseline: a plain numpy copy of the bytes a switch moves ({mib:.0f} MiB); "
                f"{b['switches']} switches")
        )  # fmt: skip
    return rows


def print_table(r: dict[str, Any]) -> None:
    print(r["output"].rstrip())
    print(f"\ntimeslice demo benchmark: {describe(r['machine'])}\n")
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--jobs", type=int, default=2, help="simulated RL jobs")
    parser.add_argument("--steps", type=int, default=6, help="steps per job")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="one step, seconds")
    parser.add_argument("--mib", type=int, default=16, help="each job's context, MiB")
    parser.add_argument("--profile", default="verl-async", help="verl-sync or verl-async")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.step_seconds = min(args.steps, 2), min(args.step_seconds, 0.5)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
