"""`python -m tests.faults`: a long fault campaign, with a table and a JSON summary.

    python -m tests.faults --runs 200 [--seed S] [--duration SEC] [--json FILE]
    python -m tests.faults --orchestrators 3 --postgres URL ...   # active and standbys

Run i uses seed S + i, so any run can be repeated alone with `--runs 1 --seed`
its seed. The exit status is 1 when any run found a violation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.faults.campaign import RunResult, Settings, run_once
from tests.faults.processes import Code, code_snapshot
from tests.faults.schedule import ACTIVE_KINDS, HA_KINDS, KINDS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1, help="seed of the first run")
    parser.add_argument("--duration", type=float, default=defaults.duration,
                        help="seconds of faults per run")  # fmt: skip
    parser.add_argument("--min-faults", type=int, default=defaults.min_faults)
    parser.add_argument("--max-faults", type=int, default=defaults.max_faults)
    parser.add_argument("--lease", type=float, default=defaults.lease)
    parser.add_argument("--switch-timeout", type=float, default=defaults.switch_timeout)
    parser.add_argument("--mib", type=int, default=defaults.mib, help="each job's context")
    parser.add_argument("--orchestrators", type=int, default=defaults.orchestrators,
                        help="candidates on one PostgreSQL journal (more than 1: --postgres)")  # fmt: skip
    parser.add_argument("--postgres", default=os.environ.get("TIMESLICE_TEST_POSTGRES_URL", ""),
                        help="a PostgreSQL server's URL; each run makes a database of its own"
                        " there (default: TIMESLICE_TEST_POSTGRES_URL)")  # fmt: skip
    parser.add_argument("--leader-lease", type=float, default=defaults.leader_lease)
    parser.add_argument("--keep", choices=("failed", "always", "never"), default="failed",
                        help="keep a run's folder (logs, journal) afterwards")  # fmt: skip
    parser.add_argument("--ref", help="test the package as of this git commit, not the checkout")
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each run's faults")
    return parser.parse_args(argv)


def summarize(results: list[RunResult], seconds: float) -> dict[str, Any]:
    kinds = HA_KINDS if any(r.failovers for r in results) else KINDS
    faults: Counter[str] = Counter({kind: 0 for kind in kinds})
    counts: Counter[str] = Counter()
    for result in results:
        faults.update(result.faults)
        counts.update(result.counts)
    failed = [r for r in results if r.violations]
    return {
        "runs": len(results),
        "seeds": [results[0].seed, results[-1].seed] if results else [],
        "faults": dict(faults),
        "grants": counts["grants"],
        "switches": counts["switches"],
        "holds": {
            "confirmed": counts["holds confirmed"],
            "not_confirmed": counts["holds not confirmed"],
        },
        "revocations": _prefixed(counts, "revoked: "),
        "quarantines": _prefixed(counts, "quarantined: "),
        "jobs_reset": counts["jobs reset"],
        "events": counts["events"],
        "runs_reopened_from_a_snapshot": counts["reopened from a snapshot"],
        "acquire_errors": counts["acquire_error"],
        "leases_lost": counts["lease_lost"],
        "stale_steps": counts["stale steps"],
        "stale_holders_found_context_saved": counts["stale holder found its context saved"],
        "max_stale_seconds": round(max((r.stale_seconds for r in results), default=0.0), 3),
        "failover_seconds": failover_figures(results),
        "violations": sum(len(r.violations) for r in results),
        "failed_runs": [
            {"seed": r.seed, "violations": r.violations, "folder": r.kept} for r in failed
        ],
        "wall_seconds": round(seconds, 1),
    }


def failover_figures(results: list[RunResult]) -> dict[str, Any]:
    """Per kind of fault of the active: how many, and the seconds from the fault to
    the takeover and to the new active's first grant (median and longest, with the
    seed of the run of the longest: `--runs 1 --seed` it to look closer)."""
    figures: dict[str, Any] = {}
    for kind in ACTIVE_KINDS:
        rows = [(r.seed, f) for r in results for f in r.failovers if f[0] == kind]
        if not rows:
            continue
        entry: dict[str, Any] = {"faults": len(rows)}
        takeovers = [(f[1], seed) for seed, f in rows if f[1] is not None]
        first_grants = [(f[2], seed) for seed, f in rows if f[2] is not None]
        for name, seen in (("takeover", takeovers), ("first_grant", first_grants)):
            longest = max(seen, default=None)
            entry[name] = {
                "seen": len(seen),
                "p50": round(statistics.median(v for v, _ in seen), 3) if seen else None,
                "max": round(longest[0], 3) if longest else None,
                "max_seed": longest[1] if longest else None,
            }
        figures[kind] = entry
    return figures


def _prefixed(counts: Counter[str], prefix: str) -> dict[str, int]:
    return {k.removeprefix(prefix): v for k, v in sorted(counts.items()) if k.startswith(prefix)}


def row(result: RunResult) -> str:
    counts = result.counts
    letters = HA_LETTERS if result.failovers or set(result.faults) & set(ACTIVE_KINDS) else LETTERS
    kinds = " ".join(f"{result.faults[k]}{letter}" for k, letter in letters.items())
    holds = f"{counts['holds confirmed']}/{counts['holds not confirmed']}"
    return (
        f"{result.seed:>6} {kinds:<18} {counts['grants']:>6} {counts['switches']:>6}"
        f" {holds:>9} {counts['stale steps']:>5} {len(result.violations):>4}"
        f" {result.seconds:>6.1f}"
    )


HEADER = (
    f"{'seed':>6} {'faults':<18} {'grants':>6} {'switch':>6} {'holds':>9} {'stale':>5}"
    f" {'viol':>4} {'sec':>6}"
)
LEGEND = (
    "faults: o orchestrator, a agent killed; h holder stopped; j job killed;"
    " with standbys: K active killed, S active stopped, C active cut from PostgreSQL"
)
LETTERS = dict(zip(KINDS, "oahj", strict=True))
HA_LETTERS = dict(zip(HA_KINDS, "KSCahj", strict=True))


async def campaign(args: argparse.Namespace) -> int:
    settings = Settings(
        duration=args.duration,
        min_faults=args.min_faults,
        max_faults=args.max_faults,
        lease=args.lease,
        switch_timeout=args.switch_timeout,
        mib=args.mib,
        orchestrators=args.orchestrators,
        postgres_url=args.postgres if args.orchestrators > 1 else "",
        leader_lease=args.leader_lease,
    )
    began = time.monotonic()
    results: list[RunResult] = []
    print(LEGEND)
    print(HEADER, flush=True)
    try:
        with code_snapshot(args.ref) as code:
            await _runs(args, settings, code, results)
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted", file=sys.stderr)
    summary = summarize(results, time.monotonic() - began)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 1 if summary["violations"] or not results else 0


async def _runs(
    args: argparse.Namespace, settings: Settings, code: Code, results: list[RunResult]
) -> None:
    for seed in range(args.seed, args.seed + args.runs):
        result = await run_once(seed, settings, code, keep=args.keep)
        results.append(result)
        print(row(result), flush=True)
        if args.verbose:
            for done in result.done:
                print(f"         {done}")
        for violation in result.violations:
            print(f"         VIOLATION: {violation}")
        if result.kept:
            print(f"         kept: {result.kept}")


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(campaign(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
