"""What starting a program that uses timeslice costs: the import of each entry
point, and `timeslice --help`, in two source trees side by side.

    python benchmarks/import_time.py --old DIR --new DIR [--runs 7] [--json OUT]

Each measurement is one fresh interpreter with the tree first on `PYTHONPATH`
(so both trees use this interpreter's installed dependencies), run alternately
old, new, old, new ... so that the machine's load falls on both alike; the
figure is the median wall time of `--runs` interpreters. A tree is a checkout
of any commit, e.g. `git worktree add /tmp/old <commit>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "timeslice --help": (
        "import sys; sys.argv = ['timeslice', '--help']; from timeslice.cli import app; app()"
    ),
    "import timeslice": "import timeslice",
    "import timeslice.client": "import timeslice.client",
    "from timeslice.client import TimeSliceOrchestratorClient": (
        "from timeslice.client import TimeSliceOrchestratorClient"
    ),
    "import timeslice.orchestrator.state": "import timeslice.orchestrator.state",
}
COUNT_MODULES = "; import sys; print(len(sys.modules))"


def run_once(tree: Path, code: str) -> tuple[float, int]:
    """Seconds one fresh interpreter took to run `code` from `tree`, and how many
    modules it had loaded by the end."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code + COUNT_MODULES],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0 and "--help" not in code:
        raise SystemExit(f"{tree}: {code!r} failed: {done.stderr.strip()[-500:]}")
    lines = done.stdout.strip().splitlines()
    return elapsed, int(lines[-1]) if lines and lines[-1].isdigit() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--new", type=Path, default=Path.cwd(), help="the tree measured")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    result: dict[str, dict[str, float]] = {}
    print(f"{'':58s} {'old':>9s} {'new':>9s}  ratio   modules old/new")
    for name, code in CASES.items():
        times: dict[str, list[float]] = {k: [] for k in trees}
        modules: dict[str, int] = {}
        for _ in range(args.runs):
            for key, tree in trees.items():
                seconds, modules[key] = run_once(tree, code)
                times[key].append(seconds)
        old, new = statistics.median(times["old"]), statistics.median(times["new"])
        result[name] = {
            "old_s": old,
            "new_s": new,
            "ratio": old / new,
            "old_modules": modules["old"],
            "new_modules": modules["new"],
        }
        print(
            f"{name:58s} {old * 1000:7.0f}ms {new * 1000:7.0f}ms  {old / new:4.1f}x"
            f"   {modules['old']}/{modules['new']}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "trees": {k: str(v) for k, v in trees.items()},
                    "runs": args.runs,
                    "cases": result,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
