"""What the benchmarks share: their processes, the echo floor, statistics, the
table every figure is reported in (each beside its baseline), and how a
benchmark runs from the command line.

Every benchmark is a module of this package with `parse_args(argv)`, an async
`run(args)` returning a JSON-ready dict, `print_table(result)` and
`summary(result)` (the rows it adds to the suite's table); `run_main` ties
them together for `python benchmarks/NAME.py --json OUT`.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import cProfile
import dataclasses
import gc
import itertools
import json
import logging
import math
import multiprocessing
import os
import platform
import signal
import socket
import sqlite3
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import grpclib.const
import numpy as np
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.encoding.base import CodecBase
from grpclib.server import Server, Stream

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

_T = TypeVar("_T")
ROOT = Path(__file__).resolve().parent.parent
ECHO_ROUTE = "/bench.Echo/Echo"
CALL_TIMEOUT = 30.0
MiB = 1024**2
ms = 1000
now = time.monotonic  # system-wide on Linux: comparable between processes

# --- processes ------------------------------------------------------------------------------


async def receive(conn: Connection) -> Any:
    """`conn.recv()` without blocking the event loop."""
    loop = asyncio.get_running_loop()
    while not conn.poll():
        readable = asyncio.Event()
        loop.add_reader(conn.fileno(), readable.set)
        try:
            await readable.wait()
        finally:
            loop.remove_reader(conn.fileno())
    return conn.recv()


class Child:
    """`target(conn, *args)` in a spawned process, driven over a pipe: its first
    message is its `address`; "stop" ends it. Leaving the block stops it, and
    terminates (then kills) it if it does not end by itself, errors included."""

    def __init__(self, target: Callable[..., None], *args: Any, name: str = "bench") -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(child, *args), name=name, daemon=True)
        self.address: Any = None
        self._asking = asyncio.Lock()  # one command at a time: answers come in order

    async def __aenter__(self) -> Self:
        self.process.start()
        try:
            self.address = await asyncio.wait_for(receive(self.conn), 120)
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the child is gone: nothing to tell
            self.conn.send("stop")
        await asyncio.to_thread(self.process.join, 15)
        if self.process.is_alive():
            self.process.terminate()
            await asyncio.to_thread(self.process.join, 5)
        if self.process.is_alive():
            self.process.kill()
            await asyncio.to_thread(self.process.join, 5)

    async def ask(self, command: Any, timeout: float = 60) -> Any:
        async with self._asking:
            self.conn.send(command)
            return await asyncio.wait_for(receive(self.conn), timeout)


#: A function run in a server process before it serves; what it returns (if not
#: None) answers the commands that `serve` does not know.
Setup = Callable[[], Callable[[Any], Any] | None]


def serve(
    conn: Connection,
    kind: str,
    db: str | None = None,
    setup: Setup | None = None,
    options: dict[str, Any] | None = None,
) -> None:
    """Process entry point: serve `kind` ("echo", or "orchestrator" journaling to the
    SQLite file `db`, or the database URL `db`, with `options` for its config)
    until told to stop; answers
    "cpu" (its CPU seconds), "usage" (`Usage`), ("profile", PATH) (start, then
    stop and dump cProfile) and, for an orchestrator, "table" on `conn`, and hands other commands to what
    `setup` returned."""
    asyncio.run(_serve(conn, kind, db, setup, options or {}))


async def _serve(
    conn: Connection, kind: str, db: str | None, setup: Setup | None, options: dict[str, Any]
) -> None:
    # Loops cancelled on the measuring side leave replies to write on connections it
    # has closed: asyncio warns of each such write, which is expected here.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    collector = GcClock()
    extra = setup() if setup is not None else None
    async with contextlib.AsyncExitStack() as stack:
        if kind == "echo":
            address = await stack.enter_async_context(echo_server())
        elif kind == "orchestrator":
            from timeslice.api.serving import tune_gc_for_serving
            from timeslice.orchestrator.server import Orchestrator

            tune_gc_for_serving()  # as `timeslice serve orchestrator` does
            # A path is an SQLite file; a URL (PostgreSQL) is taken as it is.
            url = (db if "://" in db else f"sqlite:///{db}") if db else None
            orch = await stack.enter_async_context(Orchestrator(db=url, port=0, **options))
            address = orch.address
            extra = _with_table(orch, extra)
        else:
            raise ValueError(f"unknown server kind {kind!r}")
        conn.send(address)
        profiler: cProfile.Profile | None = None
        while (command := await receive(conn)) != "stop":
            match command:
                case "cpu":
                    conn.send(time.process_time())
                case "usage":
                    conn.send(collector.usage())
                case ("profile", path):
                    if profiler is None:
                        profiler = cProfile.Profile()
                        profiler.enable()
                    else:
                        profiler.disable()
                        profiler.dump_stats(path)
                        profiler = None
                    conn.send(None)
                case _ if extra is not None:
                    conn.send(extra(command))
                case _:
                    raise ValueError(f"unknown command {command!r}")


@dataclass(frozen=True)
class Usage:
    """What a server process has used so far, read at `time` (`now()`, one clock for
    every process)."""

    time: float
    cpu: float  # CPU seconds
    gc: float  # seconds in the cyclic garbage collector, which stops the event loop
    full_gcs: int  # collections of the oldest generation
    objects: int  # objects the collector tracks


class GcClock:
    """The time this process spends in the cyclic garbage collector, from the
    collector's callbacks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.full += info["generation"] == 2

    def usage(self) -> Usage:
        at, cpu, seconds, full = now(), time.process_time(), self.seconds, self.full
        return Usage(at, cpu, seconds, full, len(gc.get_objects()))


def _with_table(orch: Any, extra: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """Also answer "table": how many groups, holders and queued jobs `orch` has."""

    def command(command: Any) -> Any:
        if command == "table":
            groups = orch.table.groups.values()
            return {
                "groups": len(groups),
                "holders": sum(g.holder is not None for g in groups),
                "waiting": sum(len(g.queue) for g in groups),
            }
        if extra is None:
            raise ValueError(f"unknown command {command!r}")
        return extra(command)

    return command


class ServerProcess(Child):
    """An echo server or an orchestrator (see `serve`) in a process of its own."""

    def __init__(
        self, kind: str, db: str | None = None, setup: Setup | None = None, **options: Any
    ) -> None:
        super().__init__(serve, kind, db, setup, options, name=f"bench-{kind}")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of every thread of process `pid` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class RawCodec(CodecBase):
    """Sends messages encoded (or bytes as they are); hands back what it receives
    as bytes, undecoded."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


# --- the floor: a plain grpclib unary echo --------------------------------------------------


class EchoService:
    """One unary method that sends the request back: the least a grpclib call costs."""

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            ECHO_ROUTE: grpclib.const.Handler(
                self.echo,
                grpclib.const.Cardinality.UNARY_UNARY,
                pb.AcquireRequest,
                pb.AcquireRequest,
            )
        }

    async def echo(self, stream: Stream[pb.AcquireRequest, pb.AcquireRequest]) -> None:
        request = await stream.recv_message()
        assert request is not None
        await stream.send_message(request)


class EchoStub:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    async def echo(self, request: pb.AcquireRequest) -> pb.AcquireRequest:
        async with self.channel.request(
            ECHO_ROUTE,
            grpclib.const.Cardinality.UNARY_UNARY,
            pb.AcquireRequest,
            pb.AcquireRequest,
            timeout=CALL_TIMEOUT,
        ) as stream:
            await stream.send_message(request, end=True)
            reply = await stream.recv_message()
        assert reply is not None
        return reply


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[str]:
    """The echo service on a loopback port, with the orchestrator's server settings
    (Nagle off, 256 KiB stream window); yields "HOST:PORT"."""
    server = Server([EchoService()], config=Configuration(http2_stream_window_size=256 * 1024))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    await server.start(sock=sock)
    try:
        yield "127.0.0.1:%d" % sock.getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


# The credentials of the measuring clients' channels (benchmarks/secure.py sets them
# for its secured variant; spawned job processes inherit them): a CA file and a token.
BENCH_TLS_CA = "TIMESLICE_BENCH_TLS_CA"
BENCH_TOKEN = "TIMESLICE_BENCH_TOKEN"


def channel(address: str) -> Channel:
    """A channel to `address`, made by the clients' own `open_channel` (TLS and the
    bearer token when TIMESLICE_BENCH_TLS_CA and TIMESLICE_BENCH_TOKEN are set)."""
    from timeslice.client._transport import open_channel
    from timeslice.ids import parse_target
    from timeslice.security.tls import ClientTls

    ca, token = os.environ.get(BENCH_TLS_CA), os.environ.get(BENCH_TOKEN)
    return open_channel(parse_target(address), ClientTls(ca=ca) if ca else None, token or None)


def echo_request() -> pb.AcquireRequest:
    """What the echoes carry: a message the size of an Acquire."""
    return pb.AcquireRequest(job_id="job-a", group_id="handoff")


async def measure_echo(address: str, samples: int, warmup: int) -> list[float]:
    """Back-to-back round trips of a plain grpclib unary call, in seconds."""
    async with channel(address) as ch:
        stub = EchoStub(ch)
        request = echo_request()
        times = []
        for i in range(warmup + samples):
            t0 = now()
            await stub.echo(request)
            if i >= warmup:
                times.append(now() - t0)
    return times


# --- statistics ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """`PREFIX_p50_ms` (the median) and `PREFIX_p99_ms` of `values` in seconds."""
    if not values:
        return {f"{prefix}_p50_ms": math.nan, f"{prefix}_p99_ms": math.nan}
    return {
        f"{prefix}_p50_ms": statistics.median(values) * ms,
        f"{prefix}_p99_ms": percentile(values, 0.99) * ms,
    }


def memcpy_gbps(nbytes: int, repeats: int) -> float:
    """A plain numpy copy of `nbytes` into memory already touched: median GB/s."""
    source = np.random.default_rng(1).random(nbytes // 8)
    target = np.empty_like(source)
    target[:] = 0
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def filesystem(path: str | Path) -> str:
    """The type and device of the file system `path` is on, as /proc/mounts says."""
    path = os.path.realpath(path)
    best = ("", "unknown", "")
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, kind = line.split()[:3]
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best[0]):
                best = (mount, kind, device)
    return f"{best[1]} ({best[2]})" if best[2] else best[1]


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "grpclib": version("grpclib"),
        "betterproto2": version("betterproto2"),
        "sqlite": sqlite3.sqlite_version,
    }


# --- throughput: many loops over a few connections ------------------------------------------

#: Binds one loop (its index) to its connection (a `Channel`, or what `connect`
#: made): returns the step it repeats.
Bind = Callable[[Any, int], Callable[[], Coroutine[Any, Any, None]]]
#: Opens one connection to an address, as an async context manager.
Connect = Callable[[str], contextlib.AbstractAsyncContextManager[Any]]


class Asked(Protocol):
    """A server that answers "usage" with its `Usage` (a `ServerProcess`, or a
    process started otherwise that reports what it has used the same way)."""

    async def ask(self, command: Any) -> Any: ...


@dataclass(frozen=True)
class Rate:
    """Steps completed while a window was open, and what the processes used meanwhile."""

    completed: int
    window: float  # seconds, as measured here
    slices: tuple[float, ...]  # steps per second in each equal slice of the window
    client_cpu: float  # CPU seconds this process used during the window
    # The server, if asked: between its two readings (which bracket the window: a
    # busy server answers late), its CPU and garbage-collection seconds, how many
    # steps ended, and how long it was.
    server_cpu: float = math.nan
    server_gc: float = math.nan
    server_steps: int = 0
    server_span: float = math.nan
    server_full_gcs: int = 0
    server_objects: int = -1  # tracked at the end
    warmup: float = 0.0  # seconds from the start of the loops to the window
    ready: bool = True  # the window opened once `ready` said so (not at the cap)

    @property
    def per_second(self) -> float:
        return self.completed / self.window

    @property
    def median_per_second(self) -> float:
        """The median of the slices' rates: a hiccup of the machine moves it less."""
        return statistics.median(self.slices)


async def measure_rate(
    address: str,
    loops: int,
    bind: Bind,
    *,
    warmup: float,
    window: float,
    per_connection: int = 1,
    server: Asked | None = None,
    ready: Callable[[], Coroutine[Any, Any, bool]] | None = None,
    warmup_cap: float = 60.0,
    slice_s: float = 0.5,
    connect: Connect = channel,
    drain: float = 0.0,
) -> Rate:
    """`loops` tasks, each repeating its step, over ceil(loops / per_connection)
    connections (made by `connect`: gRPC channels by default); count the steps that
    end while the window is open, and in each slice of it (about `slice_s` seconds).
    The window opens `warmup` seconds after the loops start and, with `ready`, once
    it says so (asked every 0.1 s), but at most `warmup_cap` seconds after the
    start. When the window closes the loops are cancelled, or with `drain` each
    ends after its step under way, and only those still running after `drain`
    seconds are cancelled (a server that mishandles a call given up on then
    serves the next measurement as it served this one)."""
    ends: list[float] = []  # when each step ended, while counting
    counting = stopping = False

    async def loop(step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while not stopping:
            await step()
            if counting:
                ends.append(now())

    async with contextlib.AsyncExitStack() as stack:
        connections = [
            await stack.enter_async_context(connect(address))
            for _ in range(math.ceil(loops / per_connection))
        ]
        started = now()
        tasks = [
            asyncio.create_task(loop(bind(connections[i // per_connection], i)))
            for i in range(loops)
        ]
        try:
            await asyncio.sleep(warmup)
            was_ready = ready is None
            while not was_ready and now() - started < warmup_cap:
                # not cancelled part way: an answer left in the pipe would answer the next ask
                was_ready = await ready()  # type: ignore[misc]
                if not was_ready:
                    await asyncio.sleep(0.1)
            counting = True
            before: Usage | None = await server.ask("usage") if server is not None else None
            t0, cpu0 = now(), time.process_time()
            await asyncio.sleep(window)
            t1, cpu1 = now(), time.process_time()
            after: Usage | None = await server.ask("usage") if server is not None else None
            counting = False
            for task in tasks:
                if task.done():
                    task.result()  # a loop that failed fails the measurement
            stopping = True
            if drain > 0:
                await asyncio.wait(tasks, timeout=drain)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    n = max(1, round((t1 - t0) / slice_s))
    edges = [t0 + (t1 - t0) * i / n for i in range(n + 1)]
    slices = tuple((between(ends, a, b)) / (b - a) for a, b in itertools.pairwise(edges))
    rate = Rate(between(ends, t0, t1), t1 - t0, slices, cpu1 - cpu0, warmup=t0 - started,
                ready=was_ready)  # fmt: skip
    if before is not None and after is not None:
        rate = dataclasses.replace(
            rate,
            server_cpu=after.cpu - before.cpu,
            server_gc=after.gc - before.gc,
            server_steps=between(ends, before.time, after.time),
            server_span=after.time - before.time,
            server_full_gcs=after.full_gcs - before.full_gcs,
            server_objects=after.objects,
        )
    return rate


async def drained(orch: Child, cap: float = 30.0) -> None:
    """Wait until the cancelled jobs' Acquires have left the orchestrator's queues, so
    that it stops with no call in flight."""
    deadline = now() + cap
    while (await orch.ask("table"))["waiting"] and now() < deadline:
        await asyncio.sleep(0.1)


def between(ordered: list[float], a: float, b: float) -> int:
    """How many of `ordered` lie in [a, b)."""
    return bisect.bisect_left(ordered, b) - bisect.bisect_left(ordered, a)


# --- the table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One figure of the table, with its baseline measured in the same run."""

    figure: str
    ours: float
    baseline: float
    unit: str  # of both
    note: str = ""  # what the baseline is, and anything the figure needs

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def number(value: float) -> str:
    """A figure to about three significant digits."""
    if not math.isfinite(value):
        return "-"
    size = abs(value)
    if size >= 100 or size == 0:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def quantity(value: float, unit: str) -> str:
    if unit == "%":
        return f"{number(value)} %"
    return f"{number(value)} {unit}".rstrip()


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a markdown table (figure, ours, baseline, ratio, note)."""
    cells = [["figure", "ours", "baseline", "ratio", "note"]]
    for r in rows:
        ratio = "-" if not math.isfinite(r.ratio) else f"{r.ratio:.{3 if r.ratio < 0.1 else 2}f}x"
        cells.append([r.figure, quantity(r.ours, r.unit), quantity(r.baseline, r.unit), ratio,
                      r.note])  # fmt: skip
    widths = [max(len(row[i]) for row in cells) for i in range(5)]
    right = (False, True, True, True, False)

    def line(row: list[str]) -> str:
        padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":" if r else ":" + "-" * (w + 1))
                          for w, r in zip(widths, right)) + "|"  # fmt: skip
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def describe(m: dict[str, Any]) -> str:
    """One line about the machine a result was measured on."""
    return (
        f"{m['cpus_usable']} CPUs ({m['cpu_model']}), Python {m['python']}, "
        f"SQLite {m['sqlite']}, grpclib {m['grpclib']}"
    )


# --- running a benchmark ------------------------------------------------------------------------


def write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def stop_on_sigterm() -> None:
    """A plain kill unwinds like Ctrl-C, so that every process started is stopped."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


async def _cancelled_on_sigterm(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """`coroutine`, cancelled (so that it unwinds: every process it started is
    stopped) on SIGTERM, as asyncio.run cancels it on Ctrl-C."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await coroutine
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def free_port() -> int:
    """A port free on 127.0.0.1 a moment ago, for a server in another process that
    cannot take port 0 and tell us."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")


def run_main(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    print_table: Callable[[dict[str, Any]], None],
) -> int:
    """Run one benchmark: `run(args)`, its table, its wall time, and `--json`."""
    started = now()
    try:
        result = asyncio.run(_cancelled_on_sigterm(run(args)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every process started here is stopped", file=sys.stderr)
        return 130
    result["wall_s"] = now() - started
    print_table(result)
    print(f"\n{result['wall_s']:.1f} s")
    if args.json:
        write_json(args.json, result)
    return 0
