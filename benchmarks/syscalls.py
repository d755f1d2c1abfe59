"""Socket writes per call: the orchestrator's and its clients', against grpclib's own.

    python benchmarks/syscalls.py --json OUT [--calls 400] [--quick]

Every system call that writes to a socket costs the writer a kernel crossing and
may wake the reader. `strace` (attached to the serving process, then to the
calling one) counts the writes to TCP sockets (`send`, `sendto`, `sendmsg`,
`write`, `writev` on a socket of the loopback connection; the event loop's own
wake-up socket and the journal's file writes are left out) over a number of
unary calls, in one run, side by side:

  echo      a plain grpclib server (no timeslice code): the same unary call
            back to back, from a plain grpclib channel;
  ours      the orchestrator (its defaults, SQLite journal on disk) answering
            one job's Acquire and Yield back to back, with nobody waiting, from
            the clients' own channel (`open_channel`).

Without strace on the machine the benchmark says so and measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import grpclib.client  # noqa: E402

from benchmarks.common import (  # noqa: E402
    CALL_TIMEOUT,
    EchoStub,
    Row,
    ServerProcess,
    add_common_arguments,
    channel,
    describe,
    echo_request,
    format_table,
    machine,
    run_main,
)
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb  # noqa: E402

WRITES = ("send", "sendto", "sendmsg", "write", "writev")
# One strace line: "[pid N] sendto(7<TCP:[127.0.0.1:41000->127.0.0.1:50051]>, ..." (-yy).
_LINE = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((\d+)<([^>]*)>")


def socket_writes(trace: str) -> Counter[str]:
    """The writes to TCP sockets in an strace log (`-yy`), by system call."""
    counts: Counter[str] = Counter()
    for line in trace.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) in WRITES and m.group(3).startswith(("TCP:", "TCPv6:")):
            counts[m.group(1)] += 1
    return counts


@contextlib.asynccontextmanager
async def traced(pid: int, path: Path) -> AsyncIterator[None]:
    """strace attached to process `pid` (every thread) while the block runs."""
    tracer = subprocess.Popen(
        ["strace", "-f", "-yy", "-qq", "-e", "trace=" + ",".join(WRITES), "-o", str(path),
         "-p", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        await asyncio.sleep(0.5)  # attaching takes a moment, and says nothing when done
        if tracer.poll() is not None:
            raise RuntimeError(f"strace could not attach: {tracer.stderr.read().decode()[:300]}")
        yield
        await asyncio.sleep(0.2)  # the last writes of the last call
    finally:
        tracer.send_signal(signal.SIGINT)
        await asyncio.to_thread(tracer.wait, 10)


async def count(
    server_pid: int, calls: int, call: Callable[[], Awaitable[Any]], calls_per_step: int, tmp: Path
) -> dict[str, Any]:
    """Socket writes per call, on the serving side and on the calling side."""
    for _ in range(20):  # warm: connections made, first-call work done
        await call()
    steps = calls // calls_per_step
    sides = {}
    for side, pid in (("server", server_pid), ("client", os.getpid())):
        path = tmp / f"{side}.trace"
        async with traced(pid, path):
            for _ in range(steps):
                await call()
        writes = socket_writes(path.read_text())
        sides[side] = {
            "writes_per_call": sum(writes.values()) / (steps * calls_per_step),
            "by_syscall": dict(writes),
        }
    return {"calls": steps * calls_per_step, **sides}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("strace") is None:
        print("strace is not installed: nothing measured", file=sys.stderr)
        return {"skipped": "strace is not installed", "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        async with ServerProcess("echo") as echo:
            host, port = echo.address.rsplit(":", 1)
            # grpclib's own channel: the floor, without our client either.
            async with grpclib.client.Channel(host, int(port)) as ch:
                stub, message = EchoStub(ch), echo_request()
                echoes = await count(
                    echo.process.pid, args.calls, lambda: stub.echo(message), 1, Path(tmp)
                )
        db = str(Path(tmp) / "journal.db")
        async with ServerProcess("orchestrator", db) as orch, channel(orch.address) as ch:
            orchestrator = pb.TimeSliceOrchestratorServiceStub(ch, timeout=CALL_TIMEOUT)
            acquire = pb.AcquireRequest(job_id="job-a", group_id="group")
            release = pb.YieldRequest(job_id="job-a", group_id="group")

            async def cycle() -> None:
                await orchestrator.acquire(acquire)
                await orchestrator.yield_(release)

            ours = await count(orch.process.pid, args.calls, cycle, 2, Path(tmp))
    return {
        "echo": echoes,
        "ours": ours,
        "parameters": {"calls": args.calls, "quick": args.quick},
        "machine": machine(),
    }


def summary(r: dict[str, Any]) -> list[Row]:
    if "skipped" in r:
        return []
    ours, echo = r["ours"], r["echo"]
    return [
        Row("socket writes per unary call, orchestrator", ours["server"]["writes_per_call"],
            echo["server"]["writes_per_call"], "",
            f"baseline: a plain grpclib server's per echo; strace, {ours['calls']} calls "
            "(Acquire and Yield back to back)"),
        Row("socket writes per unary call, client", ours["client"]["writes_per_call"],
            echo["client"]["writes_per_call"], "",
            "baseline: a plain grpclib channel's per echo; strace"),
    ]  # fmt: skip


def print_table(r: dict[str, Any]) -> None:
    print(f"timeslice syscalls benchmark: {describe(r['machine'])}")
    if "skipped" in r:
        print(f"skipped: {r['skipped']}")
        return
    for name in ("echo", "ours"):
        for side in ("server", "client"):
            print(f"{name:5} {side:6} by system call: {r[name][side]['by_syscall']}")
    print()
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--calls", type=int, default=400, help="calls counted on each side")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls = min(args.calls, 100)
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
