"""Our orchestrator beside two well-known lock services, etcd and Redis: handoff
latency and 100-job lock cycles, measured the same way for all three in one run.

    python benchmarks/anchors.py --json OUT [--quick] [--without etcd redis] [--no-install]

The servers run at once, each in a process of its own, all durable (ours four times):

  ours   a fresh orchestrator (SQLite journal on disk, its defaults: WAL,
         synchronous=FULL, our own HTTP/2 server); a lock is a group, Acquire
         and Yield.
  ours-grpclib  the same orchestrator on grpclib's HTTP/2 server
         (`http2="grpclib"`); its rows are against etcd's.
  ours-client  the same orchestrator as `ours`, its jobs calling it through
         timeslice's own client (`AsyncTimeSliceOrchestratorClient`: its Acquire
         and Yield on `timeslice.api.h2client`), one client (and connection) per
         job; its rows are against etcd's. `ours` and `ours-grpclib` are called
         through plain grpclib stubs (betterproto2's messages).
  ours-wire  the same orchestrator as `ours`, called exactly as etcd is: grpclib,
         the messages encoded and read by hand, only the fields a lock needs
         (`anchor_clients.OurWireLock`), the same handoff and cycle code; the two
         servers compared behind one client. Its rows are against etcd's.
  etcd   etcd 3.4 (Debian's etcd-server), one member, its write-ahead log fsynced
         before a write is answered; a lock is etcd's v3lock service (Lock with
         a lease, Unlock with the key it returned), called through grpclib as
         ours is (`anchor_clients.py`).
  redis  Redis (Debian's redis-server) with appendfsync always; a lock is a list
         holding one token: BLPOP takes it (a waiter blocks in the server),
         LPUSH puts it back; called through the `redis` package.

When etcd or Redis is not on PATH, it is installed with apt-get (as root, where
apt-get is; `--no-install` forbids it); a system that cannot be had, or that does
not start, is skipped with a line saying why, and its rows say so.

  handoff  job A holds the lock; job B, in another process and connection, is
           blocked acquiring it, and has been queued (the server shows it: ours
           in the group's waiting jobs, etcd a second key under the lock's
           prefix, Redis a blocked client) for `--settle-ms` (150 ms: etcd's
           waiter sets up a watch after its key is written); then A releases.
           Latency: A's release sent -> B's acquire returned (B stamps it with
           time.monotonic, one clock for every process). Blocks of handoffs
           alternate between the systems, so that all share the machine's load.
  cycles   100 jobs in 10 groups, each job looping acquire -> release on its
           group's lock: cycles per second (the median of the half-second slices
           of every block's window) and the server's CPU per cycle (user + system
           time of every thread: ours from its process, the others from
           /proc/PID/stat, summed over the blocks). After the handoffs, in as many
           blocks that go round the systems in turn, a `--window` each (1 s), so
           that a slow spell of the machine falls on all of them, not on one.
           Twice for ours and etcd: every job on a connection of its own (as
           jobs in processes of their own would be), and at most
           `--per-connection` (100) jobs sharing one, as `cycles.py` does; Redis
           only the first way, since a connection blocked in BLPOP serves
           nothing else. etcd's jobs each grant a lease on their first cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import math
import multiprocessing
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks import anchor_servers  # noqa: E402
from benchmarks.anchor_clients import (  # noqa: E402
    EtcdLock,
    OurWireLock,
    RedisLock,
    our_job_id,
    redis_connection,
)
from benchmarks.common import (  # noqa: E402
    CALL_TIMEOUT,
    Bind,
    Connect,
    Rate,
    Row,
    ServerProcess,
    add_common_arguments,
    channel,
    describe,
    drained,
    format_table,
    machine,
    measure_rate,
    ms,
    now,
    percentile,
    receive,
    run_main,
)
from benchmarks.cycles import figures, settled  # noqa: E402
from benchmarks.handoff import acquire_yield, measure_handoffs  # noqa: E402
from timeslice.client import AsyncTimeSliceOrchestratorClient  # noqa: E402

BASELINES = ("etcd", "redis")
# Ours four times: on our own HTTP/2 server (the default) and on grpclib's
# (`http2="grpclib"`), called through grpclib stubs; on our own, called through
# timeslice's client (a lock of `OurLock`, as the baselines' locks are driven);
# and on our own, called as etcd is (`OurWireLock`).
OURS = {"ours": "h2core", "ours-grpclib": "grpclib", "ours-client": "h2core",
        "ours-wire": "h2core"}  # fmt: skip
STUBBED = ("ours", "ours-grpclib")
# The systems whose handoffs and cycles run through a lock object of `lock_of`.
LOCKED = ("ours-wire", *BASELINES)
HANDOFF_LOCK = "handoff"
# Seconds the cycle loops have to end their cycles once a window closes.
DRAIN_S = 10.0


class OurConnection:
    """A job's "connection" to ours through timeslice's client: the address its
    clients dial (each `OurLock` is a client of its own, with its own connection),
    and those clients, closed with it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.clients: list[AsyncTimeSliceOrchestratorClient] = []


class OurLock:
    """Ours as a lock, through timeslice's own client: a group, Acquire and release
    (Yield), no lease."""

    def __init__(self, connection: OurConnection, name: str) -> None:
        self._client = AsyncTimeSliceOrchestratorClient(
            connection.address,
            our_job_id(),
            name,
            lease_ttl_sec=None,
            call_timeout_sec=30,
        )
        connection.clients.append(self._client)

    async def acquire(self) -> None:
        await self._client.acquire()

    async def release(self) -> None:
        await self._client.release()


@contextlib.asynccontextmanager
async def our_connection(address: str) -> AsyncIterator[OurConnection]:
    connection = OurConnection(address)
    try:
        yield connection
    finally:
        for client in connection.clients:
            await client.close()


Lock = EtcdLock | RedisLock | OurLock | OurWireLock

# --- handoffs through a lock object: the baselines, and ours called as etcd is ------------


def connector(system: str) -> Connect:
    """How a job connects to `system`: a gRPC channel, a Redis connection, or (ours
    through its client) the address its clients dial."""
    if system == "ours-client":
        return our_connection
    return redis_connection if system == "redis" else channel


def lock_of(system: str, connection: Any, name: str) -> Lock:
    if system == "ours-client":
        return OurLock(connection, name)
    if system == "ours-wire":
        return OurWireLock(connection, name)
    return RedisLock(connection, name) if system == "redis" else EtcdLock(connection, name)


async def queued(lock: EtcdLock | RedisLock | OurWireLock) -> bool:
    """Whether a second job waits for `lock` in its server."""
    if isinstance(lock, RedisLock):
        return await lock.blocked() >= 1
    return await lock.contenders() >= 2


async def until_queued(lock: EtcdLock | RedisLock | OurWireLock) -> None:
    while not await queued(lock):
        await asyncio.sleep(0.0005)  # as often as `handoff.py` asks ours


async def measure_lock_handoffs(
    system: str, address: str, samples: int, warmup: int, settle: float
) -> list[float]:
    """As `handoff.measure_handoffs` does for ours: A holds `system`'s lock, B
    (another process) blocks acquiring it; `settle` seconds after the server shows
    B waiting, A releases. Latencies (A's release sent -> B's acquire returned) in
    seconds."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    waiter = context.Process(target=wait_for_lock, args=(child, system, address),
                             name=f"bench-{system}-b", daemon=True)  # fmt: skip
    waiter.start()
    latency: list[float] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            connect = connector(system)
            a = lock_of(system, await stack.enter_async_context(connect(address)), HANDOFF_LOCK)
            status = lock_of(system, await stack.enter_async_context(connect(address)),
                             HANDOFF_LOCK)  # fmt: skip
            assert not isinstance(status, OurLock), "ours-client's handoffs are handoff.py's"
            if isinstance(a, RedisLock):
                await a.create()
            assert await asyncio.wait_for(receive(parent), 60) == "ready"
            for i in range(warmup + samples):
                await a.acquire()
                parent.send("acquire")
                await asyncio.wait_for(until_queued(status), CALL_TIMEOUT)
                await asyncio.sleep(settle)
                t0 = now()
                await a.release()
                t1 = await asyncio.wait_for(receive(parent), CALL_TIMEOUT)
                if i >= warmup:
                    latency.append(t1 - t0)
        parent.send("stop")
        await asyncio.to_thread(waiter.join, 15)
    finally:
        if waiter.is_alive():
            waiter.terminate()
    return latency


def wait_for_lock(conn: Connection, system: str, address: str) -> None:
    """Process entry point for job B: on each "acquire", block acquiring the lock,
    stamp the moment it is ours, release it, and report the stamp."""

    async def run() -> None:
        async with connector(system)(address) as connection:
            b = lock_of(system, connection, HANDOFF_LOCK)
            conn.send("ready")
            while await receive(conn) == "acquire":
                await b.acquire()
                t1 = now()
                await b.release()
                conn.send(t1)

    asyncio.run(run())


async def handoffs(
    system: str, server: Any, samples: int, warmup: int, settle: float
) -> list[float]:
    if system not in LOCKED:
        handoffs = await measure_handoffs(server.address, samples, warmup, settle,
                                          through_client=system == "ours-client")  # fmt: skip
        return handoffs.latency
    return await measure_lock_handoffs(system, server.address, samples, warmup, settle)


# --- cycles ----------------------------------------------------------------------------------


def lock_name(loops: str, group: int) -> str:
    """Each loop has locks of its own: a job stopped while it held a lock of etcd
    leaves it held until its lease ends."""
    return f"{loops}-group-{group:04d}"


def lock_cycles(system: str, groups: int, loops: str) -> Bind:
    """Job `index` of `groups` groups: each step acquires its group's lock and
    releases it."""

    def bind(connection: Any, index: int) -> Callable[[], Any]:
        lock = lock_of(system, connection, lock_name(loops, index % groups))

        async def cycle() -> None:
            await lock.acquire()
            await lock.release()

        return cycle

    return bind


async def cycles(
    system: str, server: Any, args: argparse.Namespace, loops: str, per_connection: int
) -> Rate:
    """The loops `loops`: `args.jobs` jobs in `args.groups` groups looping on
    `system`'s locks, at most `per_connection` jobs on one connection."""
    if system in STUBBED:
        rate = await measure_rate(server.address, args.jobs, acquire_yield(args.groups),
                                  warmup=args.cycle_warmup, window=args.window, server=server,
                                  per_connection=per_connection,
                                  ready=settled(server, args.jobs, args.groups))  # fmt: skip
        await drained(server)
        return rate
    if system == "redis":
        async with redis_connection(server.address) as client:
            for group in range(args.groups):
                await RedisLock(client, lock_name(loops, group)).create()
    # etcd 3.4 stops granting locks for good once a Lock call blocked in its server
    # has been given up on, for every later measurement: each loop ends its cycle.
    return await measure_rate(server.address, args.jobs, lock_cycles(system, args.groups, loops),
                              warmup=args.cycle_warmup, window=args.window, server=server,
                              per_connection=per_connection, connect=connector(system),
                              drain=DRAIN_S)  # fmt: skip


def layouts(system: str, shared: int) -> dict[str, int]:
    """The cycle loops run on `system`, by their figures' prefix: jobs per connection
    (a blocked Redis connection serves no one else: one job each there)."""
    own = {"cycles": 1}
    # Ours through its client: a client per job, so a connection each only.
    return own if system in ("redis", "ours-client") else {**own, "shared_cycles": shared}


# --- the run -----------------------------------------------------------------------------------


async def start(
    system: str, found: anchor_servers.Found, stack: contextlib.AsyncExitStack, tmp: str
) -> tuple[Any, str]:
    """`system`'s server, started on `stack`, and its version; raises RuntimeError
    (with why) when it cannot be had."""
    if system in OURS:
        server = ServerProcess("orchestrator", f"{tmp}/{system}.db", http2=OURS[system])
        return await stack.enter_async_context(server), ""
    if system in found.missing:
        raise RuntimeError(found.missing[system])
    if system == "redis" and importlib.util.find_spec("redis") is None:
        raise RuntimeError("the redis package is not installed (pip install redis)")
    program = found.paths[system]
    make = anchor_servers.etcd if system == "etcd" else anchor_servers.redis
    return await stack.enter_async_context(make(program)), anchor_servers.version(program)


async def measure(servers: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of every system in `servers`, by system: the handoffs, then the
    cycles, each in `args.blocks` blocks that go round the systems in turn."""
    latency: dict[str, list[float]] = {system: [] for system in servers}
    rates: dict[tuple[str, str], list[Rate]] = {}
    running, per_block = list(servers), max(1, args.handoffs // args.blocks)
    # Each block in another order, so that no system always follows another.
    orders = [running[b % len(running) :] + running[: b % len(running)] for b in range(args.blocks)]
    for order in orders:
        for system in order:
            latency[system] += await handoffs(
                system, servers[system], per_block, args.warmup, args.settle_ms / 1000
            )
    for block, order in enumerate(orders):
        for system in order:
            for prefix, per_connection in layouts(system, args.per_connection).items():
                # Locks of their own in every block: none is left held by the one before.
                loops = f"{prefix}-{block}"
                rate = await cycles(system, servers[system], args, loops, per_connection)
                rates.setdefault((system, prefix), []).append(rate)
                print(f"  {system}: {rate.median_per_second:.0f} cycles/s, "
                      f"{per_connection} jobs per connection", flush=True)  # fmt: skip
    figured: dict[str, Any] = {
        system: {
            "handoff_p50_ms": statistics.median(latency[system]) * ms,
            "handoff_p99_ms": percentile(latency[system], 0.99) * ms,
            "handoffs": len(latency[system]),
        }
        for system in running
    }
    for (system, prefix), measured in rates.items():
        figured[system] |= figures(prefix, measured)
    return figured


async def run(args: argparse.Namespace) -> dict[str, Any]:
    wanted = [s for s in BASELINES if s not in args.without]
    found = anchor_servers.find_programs(wanted, install=not args.no_install)
    results: dict[str, dict[str, Any]] = {
        s: {"skipped": "left out (--without)"} for s in BASELINES if s in args.without
    }
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            servers: dict[str, Any] = {}
            for system in (*OURS, *wanted):
                try:
                    servers[system], version = await start(system, found, stack, tmp)
                    results[system] = {"version": version}
                except RuntimeError as error:
                    print(f"{system}: skipped ({error})", flush=True)
                    results[system] = {"skipped": str(error)}
            for system, figured in (await measure(servers, args)).items():
                results[system] |= figured
    return {
        "systems": results,
        "targets": {
            "handoff_p50_over_etcd": 1.0,
            "handoff_p99_over_etcd": 1.5,
            "cpu_per_cycle_over_etcd": 1.0,
            "cycles_per_s_over_etcd": 1.5,
        },
        "parameters": {
            "handoffs": max(1, args.handoffs // args.blocks) * args.blocks,
            "blocks": args.blocks,
            "warmup_per_block": args.warmup,
            "settle_ms": args.settle_ms,
            "jobs": args.jobs,
            "groups": args.groups,
            "per_connection": args.per_connection,
            "cycle_warmup_s": args.cycle_warmup,
            "window_s": args.window,  # per block
            "ours": "orchestrator, SQLite journal on disk, WAL, synchronous=FULL",
            "ours-grpclib": "the same, on grpclib's HTTP/2 server (http2=grpclib)",
            "ours-client": "the same as ours, called through timeslice's client",
            "ours-wire": "the same as ours, called as etcd is (grpclib, messages by hand)",
            "etcd": "one member, data dir in a temp dir, WAL fsynced (its default); v3lock",
            "redis": "appendonly yes, appendfsync always, no RDB saves; BLPOP/LPUSH token",
        },
        "machine": machine(),
    }


# --- report ------------------------------------------------------------------------------------


def cycle_rows(
    p: dict[str, Any], ours: dict[str, Any], other: dict[str, Any], label: str, what: str,
    prefix: str, on: str = "",
) -> list[Row]:  # fmt: skip
    """cycles/s and server CPU per cycle of the loops `prefix`, ours against `other`."""
    if prefix == "shared_cycles":
        layout = f"at most {p['per_connection']} per connection"
    else:
        layout = "a connection each"
    return [
        Row(f"cycles/s, {p['jobs']} jobs in {p['groups']} groups, {layout}, against {label}{on}",
            ours[f"{prefix}_per_s"], other.get(f"{prefix}_per_s", math.nan), "/s", what),
        Row(f"server CPU per cycle, {layout}, against {label}'s{on}",
            ours[f"{prefix}_server_cpu_ms_per_step"],
            other.get(f"{prefix}_server_cpu_ms_per_step", math.nan), "ms",
            f"{what}; user + system, every thread"),
    ]  # fmt: skip


def summary(r: dict[str, Any]) -> list[Row]:
    """Our handoff (p50, p99), cycles/s and server CPU per cycle, each against
    etcd's and Redis's in the same run; and the same on grpclib's HTTP/2 server
    against etcd's."""
    p = r["parameters"]
    queued = f"B queued {p['settle_ms']:g} ms before the release; {p['handoffs']} handoffs"
    rows = []
    for own, baselines, on in (
        ("ours", BASELINES, ""),
        ("ours-grpclib", ("etcd",), ", on grpclib"),
        ("ours-client", ("etcd",), ", through timeslice's client"),
        ("ours-wire", ("etcd",), ", both called alike"),
    ):
        ours = r["systems"].get(own, {"skipped": "not measured"})
        if "skipped" in ours:
            continue
        for name in baselines:
            other = r["systems"].get(name, {"skipped": "not measured"})
            label = "etcd v3lock" if name == "etcd" else "Redis BLPOP/LPUSH"
            if "skipped" in other:
                what = first = f"{label} skipped: {other['skipped']}"
                other = {}
            else:
                what = f"baseline: {other['version']}"
                first = f"baseline: {other['version']}, {p[name]}; {queued}"
            against = f"{label}{on}"
            rows += [
                Row(f"handoff p50 against {against}", ours["handoff_p50_ms"],
                    other.get("handoff_p50_ms", math.nan), "ms", first),
                Row(f"handoff p99 against {against}", ours["handoff_p99_ms"],
                    other.get("handoff_p99_ms", math.nan), "ms", what),
            ]  # fmt: skip
            for prefix in layouts(name, p["per_connection"]):
                if f"{prefix}_per_s" not in ours:
                    continue  # a layout this one of ours does not run
                rows += cycle_rows(p, ours, other, label, what, prefix, on)
    return rows


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice against etcd and Redis: {describe(r['machine'])}")
    print(f"handoffs: {p['handoffs']} per system in {p['blocks']} alternating blocks, "
          f"B queued {p['settle_ms']:g} ms; cycles: {p['jobs']} jobs, {p['groups']} groups, "
          f"{p['blocks']} alternating blocks of {p['window_s']:g} s, a connection each or "
          f"{p['per_connection']} per connection (shared)\n")  # fmt: skip
    print(f"{'':11} {'handoff p50':>12} {'p99':>9} {'cycles/s':>9} {'CPU/cycle':>10}"
          f" {'shared: cycles/s':>17} {'CPU/cycle':>10}  version")  # fmt: skip
    for name, s in r["systems"].items():
        if "skipped" in s:
            print(f"{name:11} skipped: {s['skipped']}")
            continue
        shared = (f"{s['shared_cycles_per_s']:17.0f} {s['shared_cycles_server_cpu_ms_per_step']:7.3f} ms"
                  if "shared_cycles_per_s" in s else f"{'-':>17} {'-':>10}")  # fmt: skip
        print(f"{name:11} {s['handoff_p50_ms']:9.3f} ms {s['handoff_p99_ms']:6.3f} ms "
              f"{s['cycles_per_s']:9.0f} {s['cycles_server_cpu_ms_per_step']:7.3f} ms {shared}"
              f"  {s['version'] or 'this checkout'}")  # fmt: skip
    print()
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--handoffs", type=int, default=300, help="measured handoffs per system")
    parser.add_argument("--blocks", type=int, default=3,
                        help="alternating blocks of handoffs, then of cycles")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured handoffs per block")
    parser.add_argument("--settle-ms", type=float, default=150.0,
                        help="how long B has been queued when A releases")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the cycle loop")
    parser.add_argument("--groups", type=int, default=10, help="groups (locks) in the cycle loop")
    parser.add_argument("--per-connection", type=int, default=100,
                        help="jobs sharing a connection in the shared loops (ours, etcd)")  # fmt: skip
    parser.add_argument("--cycle-warmup", type=float, default=1.0, help="seconds before a window")
    parser.add_argument("--window", type=float, default=1.0,
                        help="seconds of cycles counted per block")  # fmt: skip
    parser.add_argument(
        "--without",
        nargs="+",
        choices=BASELINES,
        default=[],
        help="leave these baselines out (as if they could not be installed)",
    )
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="skip a baseline that is not on PATH rather than apt-get it",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.handoffs, args.blocks = min(args.handoffs, 60), 1
        args.cycle_warmup, args.window = min(args.cycle_warmup, 0.5), min(args.window, 1.5)
    if min(args.handoffs, args.blocks, args.jobs, args.groups, args.per_connection) < 1:
        parser.error("--handoffs, --blocks, --jobs, --groups and --per-connection: positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
