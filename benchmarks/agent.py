"""Agent benchmark: what moving a context costs, against what moving bytes costs.

    python benchmarks/agent.py --json OUT [--mib 512] [--cycles 5] [--ops 300]

In one run, side by side:
- snapshot and restore bandwidth of the host-memory workload (N MiB of arrays in
  another process, moved to a file and back through the Agent over gRPC, as seen
  by the caller: Snapshot sent -> operation COMPLETE), against a plain numpy copy
  of the same bytes in this process;
- the control overhead of one operation with the `noop` backend (Snapshot sent
  -> COMPLETE seen by the caller, with the server-side wait), against a plain
  grpclib unary echo round trip.
The agent, the echo server and the workload each run in a process of their own.
Medians are reported; every figure has its baseline beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from handoff import ServerProcess, machine, measure_echo, percentile, receive  # noqa: E402

from timeslice.api.gen.snapshot_agent import v1alpha1 as pb  # noqa: E402

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


def run_workload(conn: Connection, address: str, mib: int, store: str) -> None:
    """Process entry point: a host-memory workload of `mib` MiB, registered as job "w"."""
    from timeslice.client import register_workload_in_thread
    from timeslice.workloads import HostMemoryWorkload

    workload = HostMemoryWorkload(store_dir=store)
    chunk = 64
    rng = np.random.default_rng(7)
    for i in range(0, mib, chunk):
        array = workload.allocate(f"a{i}", ((min(chunk, mib - i) * MiB) // 8,), np.float64)
        array[:] = rng.random(array.shape)
        del array  # the workload must hold its arrays alone, or they cannot be freed
    handle = register_workload_in_thread(address, "w", "bench", workload=workload)
    conn.send("ready")
    conn.recv()
    handle.close()
    workload.close()


class Spawned:
    """A function in a spawned process, told to stop over a pipe."""

    def __init__(self, target: Any, *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(child, *args), daemon=True)

    async def __aenter__(self) -> Any:
        self.process.start()
        return await asyncio.wait_for(receive(self.conn), 120)

    async def __aexit__(self, *exc: object) -> None:
        self.conn.send("stop")
        await asyncio.to_thread(self.process.join, 30)
        if self.process.is_alive():
            self.process.terminate()


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


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from grpclib.client import Channel

    results: dict[str, Any] = {"parameters": vars(args), "machine": machine()}
    async with ServerProcess("echo") as echo, Spawned(serve_agent) as agent_address:
        echo_times = await measure_echo(echo.address, args.ops, warmup=50)
        host, port = agent_address.rsplit(":", 1)
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
                async with Spawned(run_workload, agent_address, args.mib, store):
                    snaps, restores, moved = [], [], 0
                    for _ in range(args.cycles):
                        took, answer = await operate(
                            stub, "snapshot", pb.SnapshotRequest(job_id="w", group="bench")
                        )
                        snaps.append(took)
                        moved = answer.storage_bytes or 0
                        took, _ = await operate(
                            stub, "restore", pb.RestoreRequest(job_id="w", group="bench")
                        )
                        restores.append(took)
        finally:
            channel.close()

    nbytes = args.mib * MiB
    copy = memcpy_gbps(nbytes, args.cycles)
    results.update(
        echo_p50_ms=percentile(echo_times, 0.5) * 1e3,
        echo_p99_ms=percentile(echo_times, 0.99) * 1e3,
        noop_op_p50_ms=percentile(noop_times, 0.5) * 1e3,
        noop_op_p99_ms=percentile(noop_times, 0.99) * 1e3,
        noop_op_over_echo_p50=percentile(noop_times, 0.5) / percentile(echo_times, 0.5),
        workload_bytes=nbytes,
        reported_storage_bytes=moved,
        snapshot_p50_s=statistics.median(snaps),
        restore_p50_s=statistics.median(restores),
        snapshot_gbps=nbytes / statistics.median(snaps) / 1e9,
        restore_gbps=nbytes / statistics.median(restores) / 1e9,
        memcpy_gbps=copy,
    )
    results["snapshot_over_memcpy"] = results["snapshot_gbps"] / copy
    results["restore_over_memcpy"] = results["restore_gbps"] / copy
    return results


def print_table(r: dict[str, Any]) -> None:
    print(
        f"timeslice agent benchmark: {r['machine']['cpu_count']} CPUs, Python {r['machine']['python']}"
    )
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
    print(f"\n{title:48} {'GB/s':>10} {'vs copy':>10}")
    print(
        f"{'snapshot (to a file, memory freed)':48} {r['snapshot_gbps']:>10.2f} {r['snapshot_over_memcpy']:>9.2f}x"
    )
    print(
        f"{'restore (byte-exact)':48} {r['restore_gbps']:>10.2f} {r['restore_over_memcpy']:>9.2f}x"
    )
    print(f"{'plain numpy copy of the same bytes':48} {r['memcpy_gbps']:>10.2f} {1.0:>9.2f}x")
    print(f"\nreported storage_bytes: {r['reported_storage_bytes']} of {r['workload_bytes']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    parser.add_argument("--mib", type=int, default=512, help="size of the host-memory workload")
    parser.add_argument("--cycles", type=int, default=5, help="snapshot/restore cycles measured")
    parser.add_argument("--ops", type=int, default=300, help="noop operations and echoes measured")
    args = parser.parse_args()
    start = time.perf_counter()
    results = asyncio.run(run(args))
    results["wall_s"] = time.perf_counter() - start
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
