"""What TLS and bearer tokens cost: handoff latency and lock throughput of an
orchestrator with TLS and an auth file, against the same without, in one run.

    python benchmarks/secure.py --json results.json [--rounds 3] [--quick]

Both variants run the measurements of benchmarks/handoff.py on a fresh
orchestrator (its own process, SQLite journal on disk with its defaults):

  handoff   job A's Yield sent -> job B's blocked Acquire returned (A and B in
            separate processes, on connections of their own);
  cycles    100 jobs in 10 groups looping acquire -> yield: cycles per second.
  call      one connection's back-to-back GetGroupStatus (lock_only) round trips:
            what TLS and the token check add to a call, with no journal write.

  plain     no TLS, no auth policy: the default loopback server.
  secure    TLS (a P-256 server certificate from a CA made for the run) and an
            auth file of one `job` principal (jobs "job-*", every group); every
            client connects over TLS and sends its bearer token on every call,
            which the server's edge looks up before the call runs.

The variants alternate, `--rounds` times each (plain first in even rounds,
secure first in odd ones), so that both see the same machine. Reported: the
median handoff over every round's samples, the median of the rounds' cycle
rates, and secure / plain for each (target: at most 1.3x, and for cycles at
least 1 / 1.3 of plain). `--memory` keeps the journal in memory, so that the
fsync of each write does not hide what the wire costs.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import (  # noqa: E402
    BENCH_TLS_CA,
    BENCH_TOKEN,
    CALL_TIMEOUT,
    Row,
    ServerProcess,
    add_common_arguments,
    channel,
    describe,
    format_table,
    machine,
    ms,
    now,
    percentile,
    run_main,
)
from benchmarks.handoff import measure_cycles, measure_handoffs  # noqa: E402
from tests.certs import make_certs  # noqa: E402
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb  # noqa: E402
from timeslice.security.principals import AuthPolicy, Principal, Role, token_sha256  # noqa: E402
from timeslice.security.tls import ServerTls  # noqa: E402

TARGET = 1.3
VARIANTS = ("plain", "secure")


def secured(folder: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The secured orchestrator's options, and the clients' environment."""
    certs = make_certs(folder, subjects=())
    token = secrets.token_urlsafe(32)
    policy = AuthPolicy(
        principals=(
            Principal(
                name="bench-jobs",
                role=Role.JOB,
                token_sha256=token_sha256(token),
                jobs=("job-*",),
                groups=("*",),
            ),
        )
    )
    options = {"tls": ServerTls(cert=certs.server.cert, key=certs.server.key), "auth": policy}
    return options, {BENCH_TLS_CA: certs.ca, BENCH_TOKEN: token}


async def measure_calls(address: str, samples: int, warmup: int) -> list[float]:
    """Back-to-back GetGroupStatus round trips on one connection, in seconds."""
    request = pb.GetGroupStatusRequest(group_id="handoff", lock_only=True)
    times: list[float] = []
    async with channel(address) as ch:
        stub = pb.TimeSliceOrchestratorServiceStub(ch, timeout=CALL_TIMEOUT)
        for i in range(warmup + samples):
            t0 = now()
            await stub.get_group_status(request)
            if i >= warmup:
                times.append(now() - t0)
    return times


async def run_variant(
    name: str,
    db: str | None,
    options: dict[str, Any],
    env: dict[str, str],
    args: argparse.Namespace,
) -> tuple[list[float], float, list[float]]:
    """One fresh orchestrator of the variant: its handoffs, its cycle rate and its
    call round trips."""
    for key in (BENCH_TLS_CA, BENCH_TOKEN):
        os.environ.pop(key, None)
    os.environ.update(env)  # the measuring channels, and job B's process, read them
    try:
        async with ServerProcess("orchestrator", db, **options) as orch:
            handoffs = await measure_handoffs(
                orch.address, args.handoffs, args.warmup, args.settle_ms / 1000
            )
            cycles = await measure_cycles(
                orch, args.jobs, args.groups, args.cycle_warmup, args.window
            )
            calls = await measure_calls(orch.address, args.calls, args.warmup)
    finally:
        for key in env:
            os.environ.pop(key, None)
    print(
        f"  {name:7} handoff p50 {statistics.median(handoffs.latency) * ms:7.3f} ms,"
        f" {cycles.per_second:7.0f} cycles/s,"
        f" call p50 {statistics.median(calls) * ms:6.3f} ms",
        file=sys.stderr,
    )
    return handoffs.latency, cycles.per_second, calls


async def run(args: argparse.Namespace) -> dict[str, Any]:
    latency: dict[str, list[float]] = {name: [] for name in VARIANTS}
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    calls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-secure-") as tmp:
        options, env = secured(Path(tmp) / "certs")
        setups = {"plain": ({}, {}), "secure": (options, env)}
        for round_ in range(args.rounds):
            order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
            print(f"round {round_ + 1} of {args.rounds}:", file=sys.stderr)
            for name in order:
                opts, variables = setups[name]
                db = None if args.memory else f"{tmp}/{name}-{round_}.db"
                samples, rate, round_trips = await run_variant(name, db, opts, variables, args)
                latency[name] += samples
                rates[name].append(rate)
                calls[name] += round_trips
    result: dict[str, Any] = {}
    for name in VARIANTS:
        result[name] = {
            "handoff_p50_ms": statistics.median(latency[name]) * ms,
            "handoff_p99_ms": percentile(latency[name], 0.99) * ms,
            "cycles_per_s": statistics.median(rates[name]),
            "cycles_per_s_rounds": rates[name],
            "call_p50_ms": statistics.median(calls[name]) * ms,
            "call_p99_ms": percentile(calls[name], 0.99) * ms,
        }
    plain, secure = result["plain"], result["secure"]
    result["handoff_p50_secure_over_plain"] = secure["handoff_p50_ms"] / plain["handoff_p50_ms"]
    result["cycles_plain_over_secure"] = plain["cycles_per_s"] / secure["cycles_per_s"]
    result["call_p50_secure_over_plain"] = secure["call_p50_ms"] / plain["call_p50_ms"]
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
        "calls_per_round": args.calls,
        "secure": "TLS (P-256 certificate, TLS 1.3) + auth file, a bearer token on every call",
        "journal": "in memory"
        if args.memory
        else "sqlite file in a temp dir, WAL, synchronous=FULL",
    }
    result["machine"] = machine()
    return result


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice TLS + token cost: {describe(r['machine'])}")
    print(
        f"{p['rounds']} round(s) of each variant, alternating; {p['handoffs_per_round']} handoffs"
        f" and a {p['window_s']:g} s cycle window ({p['jobs']} jobs, {p['groups']} groups) each;"
        f" journal: {p['journal']}"
    )
    print()
    print(format_table(summary(r)))
    for key, label in [
        ("handoff_p50_secure_over_plain", "handoff p50, secure / plain"),
        ("cycles_plain_over_secure", "cycles per second, plain / secure"),
        ("call_p50_secure_over_plain", "call round trip p50, secure / plain"),
    ]:
        verdict = "met" if r[key] <= r["target"] else "not met"
        print(f"{label:40} {r[key]:6.2f}x  (target <= {r['target']:g}x: {verdict})")


def summary(r: dict[str, Any]) -> list[Row]:
    """The suite's rows: the secured orchestrator against the plain one."""
    plain, secure = r["plain"], r["secure"]
    note = "baseline: the same run without TLS and auth"
    return [
        Row("handoff p50, TLS + token", secure["handoff_p50_ms"], plain["handoff_p50_ms"], "ms",
            note),
        Row("handoff p99, TLS + token", secure["handoff_p99_ms"], plain["handoff_p99_ms"], "ms",
            note),
        Row("acquire/yield cycles per second, TLS + token", secure["cycles_per_s"],
            plain["cycles_per_s"], "/s", note),
        Row("GetGroupStatus round trip p50, TLS + token", secure["call_p50_ms"],
            plain["call_p50_ms"], "ms", note),
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
    parser.add_argument("--calls", type=int, default=1000, help="call round trips per run")
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the throughput run")
    parser.add_argument("--groups", type=int, default=10, help="groups in the throughput run")
    parser.add_argument("--cycle-warmup", type=float, default=1.0, help="seconds before counting")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of counted cycles")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="journal in memory: no fsync in the way, so the wire's own cost shows",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.handoffs, args.warmup = 1, min(args.handoffs, 60), min(args.warmup, 10)
        args.calls = min(args.calls, 200)
        args.cycle_warmup, args.window = min(args.cycle_warmup, 0.5), min(args.window, 1.5)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
