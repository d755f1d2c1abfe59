"""Handoff latency against the grpclib floor, and lock throughput.

    python benchmarks/handoff.py --json results.json [--profile handoff.pstats]

Three measurements in one run. Each server runs in its own process, as in real
life, and the measuring clients run in this one:

  echo      a plain grpclib unary round trip on loopback: the floor.
  handoff   from job A sending Yield to job B's blocked Acquire returning. A and
            B are separate connections from separate processes; B stamps the time
            with time.monotonic(), which on Linux is one clock for every process.
  cycles    100 jobs in 10 groups, each looping acquire -> yield on its group:
            cycles completed per second over a fixed window.

The orchestrator journals to SQLite in a temporary directory, with its defaults
(WAL, synchronous=FULL). `--profile` then runs a fresh orchestrator that stamps
each stage of a handoff on the server side and runs cProfile over a second batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import pstats
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from grpclib.client import Channel  # noqa: E402

from benchmarks.common import (  # noqa: E402
    CALL_TIMEOUT,
    EchoStub,
    Rate,
    Row,
    ServerProcess,
    add_common_arguments,
    channel,
    describe,
    drained,
    echo_request,
    machine,
    measure_echo,
    measure_rate,
    ms,
    now,
    percentile,
    receive,
    run_main,
)
from timeslice.api import h2serve  # noqa: E402
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb  # noqa: E402
from timeslice.client import AsyncTimeSliceOrchestratorClient  # noqa: E402

HANDOFF_GROUP = "handoff"
JOB_A, JOB_B = "job-a", "job-b"


# --- the measurements ---------------------------------------------------------------------


@dataclass
class Handoffs:
    latency: list[float]  # A sends Yield -> B's Acquire returns, in B's process
    yield_rtt: list[float]  # A's Yield round trip
    sent_at: list[float]  # when A sent each Yield
    echo: list[float]  # echo round trips, each after the same pause as a Yield


async def measure_handoffs(
    address: str,
    samples: int,
    warmup: int,
    settle: float,
    echo_address: str | None = None,
    *,
    through_client: bool = False,
) -> Handoffs:
    """A holds the group and B waits in its queue (durably: the run pauses `settle`
    seconds after B shows up there); then A yields. With `echo_address`, each
    sample also times one echo after the same pause, so that both start from the
    same idle machine and share its background load. A and B call through grpclib
    stubs, or with `through_client` through timeslice's own client."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    waiter = context.Process(target=wait_in_queue, args=(child, address, through_client),
                             name="bench-job-b", daemon=True)  # fmt: skip
    waiter.start()
    result = Handoffs([], [], [], [])
    try:
        async with contextlib.AsyncExitStack() as stack:
            a = await stack.enter_async_context(as_job(address, JOB_A, through_client))
            status = pb.TimeSliceOrchestratorServiceStub(
                await stack.enter_async_context(channel(address)), timeout=CALL_TIMEOUT
            )
            echo = (
                EchoStub(await stack.enter_async_context(channel(echo_address)))
                if echo_address
                else None
            )
            echo_message = echo_request()
            assert await asyncio.wait_for(receive(parent), 60) == "ready"
            for i in range(warmup + samples):
                if echo is not None:
                    await asyncio.sleep(settle)
                    t0 = now()
                    await echo.echo(echo_message)
                    t_echo = now() - t0
                await a.acquire()
                parent.send("acquire")
                await _until_queued(status, JOB_B)
                await asyncio.sleep(settle)
                t0 = now()
                await a.release()
                t_yield = now() - t0
                t1 = await asyncio.wait_for(receive(parent), CALL_TIMEOUT)
                if i >= warmup:
                    result.latency.append(t1 - t0)
                    result.yield_rtt.append(t_yield)
                    result.sent_at.append(t0)
                    if echo is not None:
                        result.echo.append(t_echo)
        parent.send("stop")
        await asyncio.to_thread(waiter.join, 15)
    finally:
        if waiter.is_alive():
            waiter.terminate()
    return result


@dataclass
class Job:
    """A job of the handoff group, as the loops call it: Acquire, and Yield."""

    acquire: Callable[[], Awaitable[Any]]
    release: Callable[[], Awaitable[Any]]


@contextlib.asynccontextmanager
async def as_job(address: str, job: str, through_client: bool) -> AsyncIterator[Job]:
    """`job` of the handoff group, calling through grpclib stubs (each request built
    as it is sent), or through timeslice's client (no lease to keep alive)."""
    if through_client:
        async with AsyncTimeSliceOrchestratorClient(
            address, job, HANDOFF_GROUP, lease_ttl_sec=None, call_timeout_sec=CALL_TIMEOUT
        ) as client:
            yield Job(acquire=lambda: client.acquire(), release=client.release)
        return
    async with channel(address) as ch:
        stub = pb.TimeSliceOrchestratorServiceStub(ch, timeout=CALL_TIMEOUT)
        yield Job(
            acquire=lambda: stub.acquire(pb.AcquireRequest(job_id=job, group_id=HANDOFF_GROUP)),
            release=lambda: stub.yield_(pb.YieldRequest(job_id=job, group_id=HANDOFF_GROUP)),
        )


async def _until_queued(status: pb.TimeSliceOrchestratorServiceStub, job: str) -> None:
    request = pb.GetGroupStatusRequest(group_id=HANDOFF_GROUP)
    while True:
        group = (await status.get_group_status(request)).group
        if group is not None and job in group.waiting_jobs:
            return
        await asyncio.sleep(0.0005)


def wait_in_queue(conn: Connection, address: str, through_client: bool = False) -> None:
    """Process entry point for job B: on each "acquire", block in Acquire, stamp the
    moment it returns, yield, and report the stamp."""

    async def run() -> None:
        async with as_job(address, JOB_B, through_client) as b:
            conn.send("ready")
            while await receive(conn) == "acquire":
                await b.acquire()
                t1 = now()
                await b.release()
                conn.send(t1)

    asyncio.run(run())


def acquire_yield(groups: int) -> Callable[[Channel, int], Callable[[], Any]]:
    """Job `index` of `groups` groups: each step is one acquire -> yield cycle."""

    def bind(ch: Channel, index: int) -> Callable[[], Any]:
        stub = pb.TimeSliceOrchestratorServiceStub(ch, timeout=CALL_TIMEOUT)
        name, group = f"job-{index:05d}", f"group-{index % groups:04d}"
        acquire = pb.AcquireRequest(job_id=name, group_id=group)
        release = pb.YieldRequest(job_id=name, group_id=group)

        async def cycle() -> None:
            await stub.acquire(acquire)
            await stub.yield_(release)

        return cycle

    return bind


async def measure_cycles(
    server: ServerProcess, jobs: int, groups: int, warmup: float, window: float
) -> Rate:
    """`jobs` jobs, each on its own connection, spread over `groups` groups, each
    looping acquire -> yield; count the cycles that end inside the window."""
    rate = await measure_rate(
        server.address, jobs, acquire_yield(groups), warmup=warmup, window=window, server=server
    )
    await drained(server)
    return rate


# --- where a handoff's time goes, on the server side (--profile) ---------------------------


class Stages:
    """Server-side stamps of each handoff, from A's Yield to B's grant."""

    def __init__(self) -> None:
        self.enabled = False
        self.open: dict[str, float] | None = None
        self.done: list[dict[str, float]] = []

    def take(self) -> list[dict[str, float]]:
        done, self.done, self.open = self.done, [], None
        return done


def instrument() -> Callable[[Any], Any]:
    """In the orchestrator's process (a `ServerProcess` setup): stamp each handoff's
    stages; ("stages", ON) switches the stamping and returns the stamps so far."""
    stages = _instrument()

    def command(command: Any) -> Any:
        match command:
            case ("stages", on):
                stages.enabled = on
                return stages.take()
        raise ValueError(f"unknown command {command!r}")

    return command


def _instrument() -> Stages:
    """Wrap the servicer's Yield and Acquire and the SQLite journal's write to stamp
    a handoff's stages. Measurement only: nothing they do changes."""
    from timeslice.orchestrator import journal
    from timeslice.orchestrator.service import OrchestratorService

    stages = Stages()
    yield_, acquire = OrchestratorService.yield_, OrchestratorService.acquire
    append_now, commit = journal.SqlJournal.append_now, journal._append_sqlite

    async def stamped_yield(self: Any, message: pb.YieldRequest) -> pb.YieldResponse:
        if stages.enabled and message.job_id == JOB_A:
            stages.open = {"yield_handler": now()}
        return await yield_(self, message)

    async def stamped_acquire(self: Any, message: pb.AcquireRequest) -> pb.AcquireResponse:
        reply = await acquire(self, message)
        record = stages.open
        if record is not None and message.job_id == JOB_B:
            record["grant_returned"] = now()
            stages.done.append(record)
            stages.open = None
        return reply

    def stamped_append_now(self: Any, events: Any) -> int:
        record, start = stages.open, now()
        seq = append_now(self, events)
        if record is not None and "append_start" not in record:
            record.update(append_start=start, append_end=now())
        return seq

    def stamped_commit(dbapi_connection: Any, rows: Any) -> None:
        record, start = stages.open, now()
        commit(dbapi_connection, rows)
        if record is not None and "sql_start" not in record:
            record.update(sql_start=start, sql_end=now())

    OrchestratorService.yield_ = stamped_yield  # type: ignore[method-assign]
    OrchestratorService.acquire = stamped_acquire  # type: ignore[method-assign]
    journal.SqlJournal.append_now = stamped_append_now  # type: ignore[method-assign]
    journal._append_sqlite = stamped_commit
    return stages


STAGES = [
    ("Yield request: client -> server handler (HTTP/2, decode)", "sent", "yield_handler"),
    ("lock table, until the turn's decisions are written", "yield_handler", "append_start"),
    ("journal rows encoded", "append_start", "sql_start"),
    ("SQLite insert + commit (fsync), on the loop's thread", "sql_start", "sql_end"),
    ("journal durable -> B's Acquire handler resumes", "sql_end", "grant_returned"),
    ("Acquire reply: encode, send, client receives", "grant_returned", "returned"),
]

CATEGORIES = [
    ("idle in epoll (waiting: the network)", ("select.epoll", "selectors.py")),
    ("socket send/recv syscalls", ("_socket.socket",)),
    ("grpclib + h2 (HTTP/2 frames, headers)", ("grpclib", "/h2/", "/hpack/", "/hyperframe/")),
    ("betterproto2 (encode, decode)", ("betterproto2", "timeslice/api/", "warnings.py")),
    ("timeslice (servicer, orchestrator, lock table)", ("timeslice/",)),
    (
        "journal (to-dict, json, SQLite and its fsync)",
        (
            "json",
            "sqlite3",
            "sqlalchemy",
            "concurrent/futures",
            "_queue",
            "threading.py",
            "dataclasses.py",
            "copy.py",
        ),
    ),
    ("logging calls (h2, hpack)", ("logging/",)),
    ("asyncio event loop", ("asyncio", "_contextvars")),
]


def _category(key: tuple[str, int, str]) -> str:
    where = f"{key[0]}:{key[2]}"
    for name, needles in CATEGORIES:
        if any(needle in where for needle in needles):
            return name
    return "other (builtins, enum, typing, ...)"


#: Where the orchestrator's server (h2core) starts each call it serves: once a call.
RPC_START = (h2serve.__file__, "_start")


async def profile_handoffs(
    db: str, samples: int, warmup: int, settle: float, pstats_path: str
) -> dict[str, Any]:
    async with ServerProcess("orchestrator", db, setup=instrument) as server:
        await measure_handoffs(server.address, 0, warmup, settle)
        await server.ask(("stages", True))
        stamped = await measure_handoffs(server.address, samples, 0, settle)
        records = await server.ask(("stages", False))
        await server.ask(("profile", pstats_path))
        cpu0 = await server.ask("cpu")
        profiled = await measure_handoffs(server.address, samples, 0, settle)
        cpu1 = await server.ask("cpu")
        await server.ask(("profile", pstats_path))
    breakdown: dict[str, float] = {}
    if len(records) == samples:
        for record, sent, latency in zip(records, stamped.sent_at, stamped.latency, strict=True):
            record.update(sent=sent, returned=sent + latency)
        for label, begin, end in STAGES:
            if all(begin in r and end in r for r in records):
                breakdown[label] = statistics.median(r[end] - r[begin] for r in records) * 1000
    stats = pstats.Stats(pstats_path)
    by_category: dict[str, float] = {}
    rpcs = 0
    for key, (_, calls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_category[_category(key)] = by_category.get(_category(key), 0.0) + tottime
        if (key[0], key[2]) == RPC_START:
            rpcs += calls
    idle = by_category.pop(CATEGORIES[0][0], 0.0)
    busy = sum(by_category.values())
    return {
        "samples": samples,
        "handoff_p50_ms_stamped": statistics.median(stamped.latency) * 1000,
        "stages_p50_ms": breakdown,
        "handoff_p50_ms_under_cprofile": statistics.median(profiled.latency) * 1000,
        "server_cpu_ms_per_sample_under_cprofile": (cpu1 - cpu0) / samples * 1000,
        "server_rpcs_per_sample": rpcs / samples,
        "server_main_thread_busy_ms_per_sample": busy / samples * 1000,
        "server_main_thread_idle_ms_per_sample": idle / samples * 1000,
        "server_main_thread_busy_pct_by_category": {
            name: 100 * seconds / busy
            for name, seconds in sorted(by_category.items(), key=lambda item: -item[1])
        },
        "pstats": pstats_path,
    }


# --- report -------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        async with (
            ServerProcess("echo") as echo,
            ServerProcess("orchestrator", f"{tmp}/journal.db") as orch,
        ):
            back_to_back = await measure_echo(echo.address, args.echoes, args.warmup)
            handoffs = await measure_handoffs(
                orch.address, args.handoffs, args.warmup, args.settle_ms / 1000, echo.address
            )
            cycles = await measure_cycles(
                orch, args.jobs, args.groups, args.cycle_warmup, args.window
            )
        profile = None
        if args.profile:
            profile = await profile_handoffs(
                f"{tmp}/profile.db",
                args.profile_handoffs,
                args.warmup,
                args.settle_ms / 1000,
                args.profile,
            )
    echoes = handoffs.echo
    result: dict[str, Any] = {
        "echo_p50_ms": statistics.median(echoes) * ms,
        "echo_p99_ms": percentile(echoes, 0.99) * ms,
        "handoff_p50_ms": statistics.median(handoffs.latency) * ms,
        "handoff_p99_ms": percentile(handoffs.latency, 0.99) * ms,
        "handoff_over_echo_p50": statistics.median(handoffs.latency) / statistics.median(echoes),
        "echo_back_to_back_p50_ms": statistics.median(back_to_back) * ms,
        "echo_back_to_back_p99_ms": percentile(back_to_back, 0.99) * ms,
        "handoff_over_echo_back_to_back_p50": statistics.median(handoffs.latency)
        / statistics.median(back_to_back),
        "yield_rtt_p50_ms": statistics.median(handoffs.yield_rtt) * ms,
        "yield_rtt_p99_ms": percentile(handoffs.yield_rtt, 0.99) * ms,
        "cycles_per_s": cycles.per_second,
        "cycles_server_cpu_pct": 100 * cycles.server_cpu / cycles.server_span,
        "cycles_client_cpu_pct": 100 * cycles.client_cpu / cycles.window,
        "target_handoff_over_echo_p50": 3.0,
        "parameters": {
            "echoes_back_to_back": args.echoes,
            "echoes_paced": args.handoffs,
            "handoffs": args.handoffs,
            "warmup": args.warmup,
            "settle_ms": args.settle_ms,
            "jobs": args.jobs,
            "groups": args.groups,
            "cycle_warmup_s": args.cycle_warmup,
            "window_s": args.window,
            "journal": "sqlite file in a temp dir, WAL, synchronous=FULL",
            "transport": "grpclib over TCP loopback; servers in spawned processes",
        },
        "machine": machine(),
    }
    if profile is not None:
        result["profile"] = profile
    return result


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice handoff benchmark: {describe(r['machine'])}")
    print(f"journal: {p['journal']}; pause before each Yield and paced echo: {p['settle_ms']:g} ms")
    print()
    print(f"{'':50} {'p50 ms':>8} {'p99 ms':>8} {'n':>6}")
    rows = [
        ("grpclib unary echo, after the same pause", "echo", p["echoes_paced"]),
        ("grpclib unary echo, back to back", "echo_back_to_back", p["echoes_back_to_back"]),
        ("handoff: A sends Yield -> B's Acquire returns", "handoff", p["handoffs"]),
        ("A's Yield round trip", "yield_rtt", p["handoffs"]),
    ]
    for label, key, n in rows:
        print(f"{label:50} {r[key + '_p50_ms']:8.3f} {r[key + '_p99_ms']:8.3f} {n:6}")
    target = r["target_handoff_over_echo_p50"]
    for label, key in [
        ("paced echo", "handoff_over_echo_p50"),
        ("back-to-back echo", "handoff_over_echo_back_to_back_p50"),
    ]:
        ratio = r[key]
        verdict = "met" if ratio <= target else "not met"
        print(
            f"{'handoff p50 / ' + label + ' p50':50} {ratio:8.2f}x  (target <= {target:g}x: {verdict})"
        )
    print(
        f"{'acquire/yield cycles per second':50} {r['cycles_per_s']:8.0f}  "
        f"({p['jobs']} jobs, {p['groups']} groups, {p['window_s']:g} s; "
        f"CPU: orchestrator {r['cycles_server_cpu_pct']:.0f}%, clients {r['cycles_client_cpu_pct']:.0f}%)"
    )
    if (profile := r.get("profile")) is not None:
        print()
        print(
            f"server side of a handoff, p50 of each stage ({profile['samples']} handoffs, "
            f"end to end p50 {profile['handoff_p50_ms_stamped']:.3f} ms):"
        )
        for label, value in profile["stages_p50_ms"].items():
            print(f"  {label:58} {value:7.3f} ms")
        print(
            f"under cProfile (handoff p50 {profile['handoff_p50_ms_under_cprofile']:.3f} ms), per sample "
            f"({profile['server_rpcs_per_sample']:.1f} RPCs: 2 Acquire, 2 Yield, status polls): "
            f"orchestrator CPU {profile['server_cpu_ms_per_sample_under_cprofile']:.2f} ms, main thread outside epoll "
            f"{profile['server_main_thread_busy_ms_per_sample']:.2f} ms, of which:"
        )
        for label, value in profile["server_main_thread_busy_pct_by_category"].items():
            print(f"  {label:58} {value:6.1f} %")
        print(f"  (pstats: {profile['pstats']})")


def summary(r: dict[str, Any]) -> list[Row]:
    """The suite's rows: the handoff against the echo, paced and back to back."""
    p = r["parameters"]
    paced = f"grpclib echo after the same {p['settle_ms']:g} ms pause"
    return [
        Row("handoff p50: A's Yield sent -> B's Acquire returned", r["handoff_p50_ms"],
            r["echo_p50_ms"], "ms", f"baseline: {paced}; {p['handoffs']} handoffs"),
        Row("handoff p99", r["handoff_p99_ms"], r["echo_p99_ms"], "ms", f"baseline: {paced}"),
        Row("handoff p50 against a back-to-back echo", r["handoff_p50_ms"],
            r["echo_back_to_back_p50_ms"], "ms", "baseline: grpclib echo p50, back to back"),
        Row("A's Yield round trip p50", r["yield_rtt_p50_ms"], r["echo_p50_ms"], "ms",
            f"baseline: {paced}"),
    ]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--echoes", type=int, default=1000, help="measured echo round trips")
    parser.add_argument("--handoffs", type=int, default=500, help="measured handoffs")
    parser.add_argument(
        "--warmup", type=int, default=50, help="unmeasured echoes and handoffs first"
    )
    parser.add_argument(
        "--settle-ms",
        type=float,
        default=5.0,
        help="pause after B is queued, so that its Acquire is durable before A yields",
    )
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the throughput run")
    parser.add_argument("--groups", type=int, default=10, help="groups in the throughput run")
    parser.add_argument(
        "--cycle-warmup", type=float, default=1.0, help="seconds before the window opens"
    )
    parser.add_argument(
        "--window", type=float, default=5.0, help="seconds over which cycles are counted"
    )
    parser.add_argument(
        "--profile", metavar="PSTATS", help="also profile the server side of handoffs"
    )
    parser.add_argument(
        "--profile-handoffs", type=int, default=200, help="handoffs per profiled batch"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.echoes, args.handoffs = min(args.echoes, 200), min(args.handoffs, 60)
        args.warmup, args.profile_handoffs = min(args.warmup, 10), min(args.profile_handoffs, 50)
        args.cycle_warmup, args.window = min(args.cycle_warmup, 0.5), min(args.window, 1.5)
    if args.profile:
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
