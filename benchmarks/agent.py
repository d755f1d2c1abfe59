"""Agent benchmark: what moving a context costs, against what moving bytes costs.

    python benchmarks/agent.py --json OUT [--mib 512] [--cycles 5] [--ops 300] [--quick]

In one run, side by side:
- snapshot and restore bandwidth of the host-memory workload (N MiB of arrays in
  another process, moved out and back through the Agent over gRPC, as seen by
  the caller: Snapshot sent -> operation COMPLETE), with each of its stores:
  to a file and back, against a plain numpy copy of the same bytes into memory
  already touched (the figures of earlier runs); and to host memory and back,
  against a copy of the same bytes into a fresh huge-page mapping with the
  source unmapped (what a snapshot to memory does at the least), in this
  process once before each cycle, so that both see the machine alike (each
  figure the second of two back to back: copies, and cycles); and the
  memory store's own copy (`MemoryStore.save`, the source then unmapped) in
  this process, against the same baseline timed just before each, which tells
  the store's copy from what the workload's process and the calls add;
- the control overhead of one operation with the `noop` backend (Snapshot sent
  -> COMPLETE seen by the caller, with the server-side wait), against a plain
  grpclib unary echo round trip.
The agent, the echo server and the workload each run in a process of their own.
Medians are reported; every figure has its baseline beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import mmap
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import (  # noqa: E402
    Child,
    Row,
    ServerProcess,
    add_common_arguments,
    describe,
    machine,
    measure_echo,
    memcpy_gbps,
    percentile,
    receive,
    run_main,
)
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb  # noqa: E402
from timeslice.workloads.hoststore import MemoryStore  # noqa: E402

GiB = 1024**3
MiB = 1024**2


def serve_agent(conn: Connection) -> None:
    """Process entry point: an Agent with the noop and app_channel backends."""

    async def main() -> None:
        from timeslice.agent.server import Agent

        async with Agent(node_name="bench", backends=("noop", "app_channel")) as agent:
            conn.send(agent.address)
            await receive(conn)

    asyncio.run(main())


def run_workload(conn: Connection, address: str, mib: int, store: str, job: str) -> None:
    """Process entry point: a host-memory workload of `mib` MiB with `store` ("memory",
    or the directory of a file store), registered as `job`."""
    from timeslice.client import register_workload_in_thread
    from timeslice.workloads import HostMemoryWorkload

    if store == "memory":
        workload = HostMemoryWorkload(store="memory")
    else:
        workload = HostMemoryWorkload(store_dir=store, store="file")
    chunk = 64
    rng = np.random.default_rng(7)
    for i in range(0, mib, chunk):
        array = workload.allocate(f"a{i}", ((min(chunk, mib - i) * MiB) // 8,), np.float64)
        array[:] = rng.random(array.shape)
        del array  # the workload must hold its arrays alone, or they cannot be freed
    handle = register_workload_in_thread(address, job, "bench", workload=workload)
    conn.send("ready")
    conn.recv()
    handle.close()
    workload.close()


async def operate(stub: pb.SnapshotAgentServiceStub, kind: str, request: Any) -> tuple[float, Any]:
    """Start an operation and wait for it; (seconds seen by the caller, final answer)."""
    start = time.perf_counter()
    call = stub.snapshot if kind == "snapshot" else stub.restore
    op_id = (await call(request)).operation_id
    while True:
        answer = await stub.get_operation(
            pb.GetOperationRequest(operation_id=op_id, wait_ms=30_000)
        )
        if answer.status != pb.OperationStatus.PENDING:
            break
    if answer.status != pb.OperationStatus.COMPLETE:
        raise RuntimeError(f"{kind} failed: {answer.error}")
    return time.perf_counter() - start, answer


def hugepage_copy_seconds(nbytes: int) -> float:
    """How long a copy of `nbytes` of touched memory into a fresh anonymous mapping
    advised to use huge pages takes, the source then unmapped: the second of two
    copies back to back. A virtual machine may hand memory freed a while ago back
    to its host (free page reporting), and such memory faults in several times
    slower; the first copy leaves the second memory as recently freed as the
    workload's own back-to-back cycles find, so that the baseline is at its best."""
    _copy_to_fresh_mapping(nbytes)
    return _copy_to_fresh_mapping(nbytes)


def _copy_to_fresh_mapping(nbytes: int) -> float:
    source = _touched_mapping(nbytes)
    data = np.frombuffer(source, np.float64)
    start = time.perf_counter()
    target = _huge_mapping(nbytes)
    copy = np.frombuffer(target, np.float64)
    np.copyto(copy, data)
    del data
    source.close()
    took = time.perf_counter() - start
    del copy
    target.close()
    return took


def store_copy_seconds(nbytes: int) -> float:
    """How long the memory store takes to keep a copy of `nbytes` of touched
    memory, the source then unmapped: what a snapshot to host memory does in the
    workload's process, without the process and the calls around it."""
    source = _touched_mapping(nbytes)
    store = MemoryStore()
    start = time.perf_counter()
    store.save("array", source, nbytes)
    source.close()
    took = time.perf_counter() - start
    store.close()
    return took


def _touched_mapping(nbytes: int) -> mmap.mmap:
    """A fresh huge-page mapping of `nbytes`, every byte written (random numbers,
    in place: no second mapping to free)."""
    source = _huge_mapping(nbytes)
    np.random.default_rng(1).random(out=np.frombuffer(source, np.float64))
    return source


def _huge_mapping(nbytes: int) -> mmap.mmap:
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_HUGEPAGE)
    return memory


async def measure_workload(
    stub: pb.SnapshotAgentServiceStub,
    agent: str,
    args: argparse.Namespace,
    store: str,
    job: str,
    baseline: Callable[[], float] | None = None,
) -> tuple[list[float], list[float], list[float], int]:
    """Snapshot and restore a workload with `store` `args.cycles` times, and run
    `baseline` (a measure of its own, in seconds) once before each cycle, so that
    both see the machine as it is then: (snapshot seconds, restore seconds,
    baseline seconds, storage bytes it reported).

    Each measured cycle is the second of two back to back, as the baseline's copy
    is: the first finds the agent and the workload woken from the seconds the
    baseline took (on a virtual machine a process that slept that long answers
    its first call tens of milliseconds late), the second the two of them as the
    first left them, and the memory the first freed."""
    async with Child(run_workload, agent, args.mib, store, job, name=f"bench-workload-{job}"):
        snaps, restores, base, moved = [], [], [], 0
        snapshot = pb.SnapshotRequest(job_id=job, group="bench")
        restore = pb.RestoreRequest(job_id=job, group="bench")
        for _ in range(args.cycles):
            if baseline is not None:
                base.append(baseline())
            await operate(stub, "snapshot", snapshot)
            await operate(stub, "restore", restore)
            took, answer = await operate(stub, "snapshot", snapshot)
            snaps.append(took)
            moved = answer.storage_bytes or 0
            took, _ = await operate(stub, "restore", restore)
            restores.append(took)
    return snaps, restores, base, moved


def store_figures(
    prefix: str, nbytes: int, snaps: list[float], restores: list[float], moved: int
) -> dict[str, Any]:
    """One store's figures, their names starting with `prefix`."""
    snap, restore = statistics.median(snaps), statistics.median(restores)
    return {
        f"{prefix}reported_storage_bytes": moved,
        f"{prefix}snapshot_p50_s": snap,
        f"{prefix}restore_p50_s": restore,
        f"{prefix}snapshot_gbps": nbytes / snap / 1e9,
        f"{prefix}restore_gbps": nbytes / restore / 1e9,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from grpclib.client import Channel

    results: dict[str, Any] = {"parameters": vars(args), "machine": machine()}
    nbytes = args.mib * MiB
    huge_copy = functools.partial(hugepage_copy_seconds, nbytes)
    async with ServerProcess("echo") as echo, Child(serve_agent, name="bench-agent") as agent:
        echo_times = await measure_echo(echo.address, args.ops, warmup=50)
        host, port = agent.address.rsplit(":", 1)
        channel = Channel(host, int(port))
        stub = pb.SnapshotAgentServiceStub(channel)
        try:
            noop = pb.BackendConfig(named=pb.NamedBackendConfig(name="noop"))
            first = pb.SnapshotRequest(job_id="n", group="bench", backend_config=noop)
            await operate(stub, "snapshot", first)
            await operate(stub, "restore", pb.RestoreRequest(job_id="n", group="bench"))
            noop_times = []
            for i in range(args.ops + 20):
                kind = "snapshot" if i % 2 == 0 else "restore"
                request: Any = (pb.SnapshotRequest(job_id="n", group="bench") if kind == "snapshot"
                                else pb.RestoreRequest(job_id="n", group="bench"))  # fmt: skip
                took, _ = await operate(stub, kind, request)
                if i >= 20:
                    noop_times.append(took)

            with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as store:
                snaps, restores, _, moved = await measure_workload(
                    stub, agent.address, args, store, "w"
                )
            in_memory = await measure_workload(
                stub, agent.address, args, "memory", "m", baseline=huge_copy
            )
        finally:
            channel.close()
    store_base, store_times = [], []
    for _ in range(args.cycles):
        store_base.append(huge_copy())
        store_times.append(store_copy_seconds(nbytes))

    copy = memcpy_gbps(nbytes, args.cycles)
    memory_snaps, memory_restores, huge_times, memory_moved = in_memory
    huge = nbytes / statistics.median(huge_times) / 1e9
    results.update(
        echo_p50_ms=percentile(echo_times, 0.5) * 1e3,
        echo_p99_ms=percentile(echo_times, 0.99) * 1e3,
        noop_op_p50_ms=percentile(noop_times, 0.5) * 1e3,
        noop_op_p99_ms=percentile(noop_times, 0.99) * 1e3,
        noop_op_over_echo_p50=percentile(noop_times, 0.5) / percentile(echo_times, 0.5),
        workload_bytes=nbytes,
        **store_figures("", nbytes, snaps, restores, moved),
        memcpy_gbps=copy,
        **store_figures("memory_", nbytes, memory_snaps, memory_restores, memory_moved),
        hugepage_copy_gbps=huge,
        # Every run, for the spread: on a virtual machine fresh memory is sometimes
        # slow to fault in, whoever asks for it.
        memory_snapshot_s=memory_snaps,
        memory_restore_s=memory_restores,
        hugepage_copy_s=huge_times,
        store_copy_gbps=nbytes / statistics.median(store_times) / 1e9,
        store_copy_baseline_gbps=nbytes / statistics.median(store_base) / 1e9,
        store_copy_s=store_times,
        store_copy_baseline_s=store_base,
    )
    results["snapshot_over_memcpy"] = results["snapshot_gbps"] / copy
    results["restore_over_memcpy"] = results["restore_gbps"] / copy
    for key in ("snapshot", "restore", "memory_snapshot", "memory_restore"):
        results[f"{key}_over_hugepage"] = results[f"{key}_gbps"] / huge
    return results


def print_table(r: dict[str, Any]) -> None:
    print(f"timeslice agent benchmark: {describe(r['machine'])}")
    print(f"\n{'':48} {'p50':>10} {'p99':>10}")
    print(
        f"{'grpclib unary echo round trip':48} {r['echo_p50_ms']:>8.3f}ms {r['echo_p99_ms']:>8.3f}ms"
    )
    print(f"{'noop operation: Snapshot sent -> COMPLETE':48} {r['noop_op_p50_ms']:>8.3f}ms "
          f"{r['noop_op_p99_ms']:>8.3f}ms")  # fmt: skip
    print(f"{'noop operation / echo (p50)':48} {r['noop_op_over_echo_p50']:>9.2f}x")
    mib = r["workload_bytes"] // MiB
    runs = r["parameters"]["cycles"]
    title = f"{mib} MiB host-memory workload, median of {runs} runs"
    print(f"\n{title:48} {'GB/s':>10} {'vs copy':>10} {'vs huge':>10}")
    for label, key in (
        ("snapshot (to a file, memory freed)", "snapshot"),
        ("restore (from a file, byte-exact)", "restore"),
        ("snapshot (to host memory, memory freed)", "memory_snapshot"),
        ("restore (from host memory, byte-exact)", "memory_restore"),
    ):
        gbps = r[f"{key}_gbps"]
        print(f"{label:48} {gbps:>10.2f} {gbps / r['memcpy_gbps']:>9.2f}x"
              f" {r[f'{key}_over_hugepage']:>9.2f}x")  # fmt: skip
    huge_over_copy = r["hugepage_copy_gbps"] / r["memcpy_gbps"]
    print(f"{'plain numpy copy of the same bytes':48} {r['memcpy_gbps']:>10.2f} {1.0:>9.2f}x")
    print(f"{'copy into a fresh huge-page mapping, src freed':48} {r['hugepage_copy_gbps']:>10.2f}"
          f" {huge_over_copy:>9.2f}x {1.0:>9.2f}x")  # fmt: skip
    store = "the memory store's copy alone, in this process"
    print(f"{store:48} {r['store_copy_gbps']:>10.2f} {'':>10}"
          f" {r['store_copy_gbps'] / r['store_copy_baseline_gbps']:>9.2f}x")  # fmt: skip
    print(f"\nreported storage_bytes: {r['reported_storage_bytes']} (file),"
          f" {r['memory_reported_storage_bytes']} (memory) of {r['workload_bytes']}")  # fmt: skip


def summary(r: dict[str, Any]) -> list[Row]:
    """The suite's rows: bandwidth against a copy, a noop operation against an echo."""
    mib, runs = r["workload_bytes"] // MiB, r["parameters"]["cycles"]
    copy = f"baseline: a plain numpy copy of the same bytes; {mib} MiB, median of {runs}"
    huge = (f"baseline: a copy of the same bytes into a fresh huge-page mapping, the source"
            f" unmapped; {mib} MiB, median of {runs}")  # fmt: skip
    second = ", each the second of two cycles back to back"
    both = ", each the second of two back to back (copies, and cycles)"
    return [
        Row("snapshot bandwidth, host-memory workload (to a file)", r["snapshot_gbps"],
            r["memcpy_gbps"], "GB/s", copy + second),
        Row("restore bandwidth, host-memory workload (byte-exact)", r["restore_gbps"],
            r["memcpy_gbps"], "GB/s", copy + second),
        Row("snapshot bandwidth, host-memory workload (to host memory)",
            r["memory_snapshot_gbps"], r["hugepage_copy_gbps"], "GB/s", huge + both),
        Row("restore bandwidth, host-memory workload (from host memory)",
            r["memory_restore_gbps"], r["hugepage_copy_gbps"], "GB/s", huge + both),
        Row("the memory store's copy alone, in this process (MemoryStore.save)",
            r["store_copy_gbps"], r["store_copy_baseline_gbps"], "GB/s",
            huge + ", timed just before each"),
        Row("noop operation p50: Snapshot sent -> COMPLETE", r["noop_op_p50_ms"],
            r["echo_p50_ms"], "ms", "baseline: grpclib echo p50, back to back"),
    ]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--mib", type=int, default=512, help="size of the host-memory workload")
    parser.add_argument("--cycles", type=int, default=5, help="snapshot/restore cycles measured")
    parser.add_argument("--ops", type=int, default=300, help="noop operations and echoes measured")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.cycles, args.ops = min(args.mib, 64), min(args.cycles, 3), min(args.ops, 100)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
