"""The `cuda` backend on a real GPU: checkpoint and restore speed, and the bytes
coming back intact, beside a pinned host<->device copy of the same size.

    python benchmarks/gpu/cuda_checkpoint.py [--gib 4] [--rounds 3] [--device 0] [--json OUT]

A child process (started here, killed at the end whatever happens) fills N GiB
of device memory with a known pattern (cuMemAlloc + cuMemcpyHtoD), measures a
pinned copy of the same size each way (cuMemAllocHost, cuMemcpyHtoD/DtoH), and
waits. This process then runs the backend's snapshot and restore on the child
in-process, as the agent does (it initializes the driver but creates no context
of its own), and after every round the child copies its memory back
(cuMemcpyDtoH) and compares it with the pattern.

Rates are in GB/s (10^9 bytes a second) of the allocation's size. The
checkpoint also moves the child's context (NVML's figure is shown beside), and
its time is the backend's whole snapshot as the agent sees it (the state
checks and NVML reads included). Needs cuda-python, numpy and a GPU with an
R570 (CUDA 12.8) driver or newer; fails with a clear message without them.
Finishes within `--deadline` seconds (default 280).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

GB = 1e9
GIB = 1 << 30
CHUNK = 1 << 23  # uint64 elements handled at once: 64 MiB
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # the pattern: element i holds i * GOLDEN (mod 2**64)
READY_TIMEOUT_S = 180.0
VERIFY_TIMEOUT_S = 120.0


# --- the child: owns the device memory --------------------------------------------------


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        from cuda import cuda as driver  # cuda-python before 12.6
    return driver


def _ok(result: Any, what: str) -> Any:
    result = result if isinstance(result, tuple) else (result,)
    if int(result[0]) != 0:
        raise RuntimeError(f"{what} failed: {getattr(result[0], 'name', result[0])}")
    return result[1] if len(result) == 2 else result[1:]


def _pattern(start: int, stop: int) -> np.ndarray:
    return np.arange(start, stop, dtype=np.uint64) * GOLDEN


def _fill(view: np.ndarray) -> None:
    for start in range(0, view.size, CHUNK):
        stop = min(start + CHUNK, view.size)
        view[start:stop] = _pattern(start, stop)


def _mismatches(view: np.ndarray) -> int:
    bad = 0
    for start in range(0, view.size, CHUNK):
        stop = min(start + CHUNK, view.size)
        bad += int(np.count_nonzero(view[start:stop] != _pattern(start, stop)))
    return bad


def _emit(**message: Any) -> None:
    print(json.dumps(message), flush=True)


def child(gib: float, device: int, repeats: int) -> int:
    """Allocate, fill, measure pinned copies, then answer `verify` and `exit` on stdin."""
    try:
        cu = _driver()
        nbytes = int(gib * GIB) // 8 * 8
        _ok(cu.cuInit(0), "cuInit")
        dev = _ok(cu.cuDeviceGet(device), "cuDeviceGet")
        ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        dptr = _ok(cu.cuMemAlloc(nbytes), "cuMemAlloc")
        hptr = int(_ok(cu.cuMemAllocHost(nbytes), "cuMemAllocHost"))
        pinned = np.frombuffer(
            memoryview((ctypes.c_char * nbytes).from_address(hptr)), dtype=np.uint64
        )
        _fill(pinned)

        def timed(copy: Any, *args: Any) -> float:
            started = time.perf_counter()
            _ok(copy(*args), copy.__name__)
            _ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            return time.perf_counter() - started

        h2d = [timed(cu.cuMemcpyHtoD, dptr, hptr, nbytes) for _ in range(repeats)]
        d2h = [timed(cu.cuMemcpyDtoH, hptr, dptr, nbytes) for _ in range(repeats)]
        if (bad := _mismatches(pinned)) != 0:
            raise RuntimeError(f"the pinned round trip changed {bad} words")
        del pinned
        _ok(cu.cuMemFreeHost(hptr), "cuMemFreeHost")  # only the device buffer stays
        _emit(event="ready", pid=os.getpid(), bytes=nbytes, h2d_s=h2d, d2h_s=d2h)

        for line in sys.stdin:
            command = line.strip()
            if command == "exit":
                break
            if command == "verify":
                started = time.perf_counter()
                host = np.empty(nbytes // 8, dtype=np.uint64)
                _ok(cu.cuMemcpyDtoH(host.ctypes.data, dptr, nbytes), "cuMemcpyDtoH")
                _ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
                bad = _mismatches(host)
                del host
                _emit(event="verified", mismatches=bad, seconds=time.perf_counter() - started)
        _ok(cu.cuMemFree(dptr), "cuMemFree")
        _ok(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
        return 0
    except Exception as exc:
        _emit(event="error", message=f"{type(exc).__name__}: {exc}")
        return 1


# --- this process: the agent's side --------------------------------------------------------


class Child:
    """The child process, spoken to in lines of JSON."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, args: argparse.Namespace) -> Child:
        process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--child", "--gib", str(args.gib),
            "--device", str(args.device), "--repeats", str(args.repeats),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        return cls(process)

    async def receive(self, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            raise RuntimeError(f"the child did not answer within {timeout:g} s") from None
        if not line:
            raise RuntimeError(f"the child exited (status {await self.process.wait()})")
        message: dict[str, Any] = json.loads(line)
        if message.get("event") == "error":
            raise RuntimeError(f"the child failed: {message['message']}")
        return message

    async def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()

    async def stop(self) -> None:
        if self.process.returncode is not None:
            return
        with contextlib.suppress(Exception):
            await self.send("exit")
            await asyncio.wait_for(self.process.wait(), 10)
        if self.process.returncode is None:
            self.process.kill()  # also when it is still locked or checkpointed
            await self.process.wait()


def probe_gpu(device: int) -> int:
    """The driver's version; SystemExit with a clear message when there is no GPU."""
    from timeslice.backends import _cuda_driver as drv
    from timeslice.errors import TimeSliceError

    try:
        cu = drv.import_driver()
        drv.check_bindings(cu)
        version = drv.init_driver(cu)  # cuInit only: no context in this process
        count = _ok(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    except (TimeSliceError, RuntimeError) as exc:
        raise SystemExit(f"cuda_checkpoint: no usable GPU: {exc}") from None
    if not 0 <= device < int(count):
        raise SystemExit(f"cuda_checkpoint: no GPU {device} (this node has {count})")
    return version


async def used_bytes(backend: Any) -> int | None:
    memory = await backend.accelerators()
    return sum(m.used_bytes for m in memory) if memory else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from timeslice.agent.channels import WorkloadChannels
    from timeslice.backends import BackendContext, JobRef
    from timeslice.backends.cuda import CudaBackend

    version = probe_gpu(args.device)
    transfer_s = max(60.0, 20.0 * args.gib)
    options = {"transfer_timeout_s": str(transfer_s), "lock_timeout_s": "30"}
    backend = CudaBackend(BackendContext(platform.node(), WorkloadChannels(), options))
    child = await Child.start(args)
    try:
        ready = await child.receive(READY_TIMEOUT_S)
        nbytes = int(ready["bytes"])
        job = JobRef("bench", "cuda-checkpoint", {"pids": [int(ready["pid"])]})
        await backend.check(job)
        if (where := await backend.state(job)) != "RUNNING":
            raise RuntimeError(f"the child is {where}, not RUNNING")
        rounds: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            before = await used_bytes(backend)
            started = time.perf_counter()
            saved = await backend.snapshot(job, {"timeout": transfer_s})
            checkpoint_s = time.perf_counter() - started
            after = await used_bytes(backend)
            if (where := await backend.state(job)) != "SAVED":
                raise RuntimeError(f"after the snapshot the child is {where}, not SAVED")
            started = time.perf_counter()
            await backend.restore(job, {"timeout": transfer_s})
            restore_s = time.perf_counter() - started
            if (where := await backend.state(job)) != "RUNNING":
                raise RuntimeError(f"after the restore the child is {where}, not RUNNING")
            await child.send("verify")
            verified = await child.receive(VERIFY_TIMEOUT_S)
            rounds.append({
                "checkpoint_s": checkpoint_s,
                "restore_s": restore_s,
                "checkpoint_gbps": nbytes / checkpoint_s / GB,
                "restore_gbps": nbytes / restore_s / GB,
                "moved_device_bytes": saved.device_bytes,
                "freed_bytes": before - after if before is not None and after is not None else None,
                "mismatches": int(verified["mismatches"]),
            })  # fmt: skip
    finally:
        await child.stop()
        await backend.close()
    h2d, d2h = ready["h2d_s"], ready["d2h_s"]
    return {
        "gib": args.gib,
        "bytes": nbytes,
        "device": args.device,
        "driver_cuda_version": f"{version // 1000}.{version % 1000 // 10}",
        "pinned_h2d_gbps": nbytes / min(h2d) / GB,
        "pinned_d2h_gbps": nbytes / min(d2h) / GB,
        "checkpoint_gbps_median": statistics.median(r["checkpoint_gbps"] for r in rounds),
        "restore_gbps_median": statistics.median(r["restore_gbps"] for r in rounds),
        "rounds": rounds,
        "intact": all(r["mismatches"] == 0 for r in rounds),
    }


def print_table(result: dict[str, Any]) -> None:
    gib = result["bytes"] / GIB
    print(
        f"{gib:.2f} GiB on GPU {result['device']}, driver for CUDA {result['driver_cuda_version']}"
    )
    print()
    print(f"{'':34} {'GB/s':>8} {'seconds':>9}")
    size = result["bytes"] / GB
    for label, key in (("pinned copy, device -> host", "pinned_d2h_gbps"),
                       ("pinned copy, host -> device", "pinned_h2d_gbps")):  # fmt: skip
        print(f"{label:34} {result[key]:8.2f} {size / result[key]:9.3f}")
    for i, r in enumerate(result["rounds"], 1):
        print(
            f"{f'round {i}: checkpoint (snapshot)':34} {r['checkpoint_gbps']:8.2f} {r['checkpoint_s']:9.3f}"
        )
        print(f"{f'round {i}: restore':34} {r['restore_gbps']:8.2f} {r['restore_s']:9.3f}")
    print()
    for i, r in enumerate(result["rounds"], 1):
        moved, freed, bad = r["moved_device_bytes"], r["freed_bytes"], r["mismatches"]
        moved_text = "-" if moved is None else f"{moved / GIB:.2f} GiB"
        freed_text = "-" if freed is None else f"{freed / GIB:.2f} GiB"
        intact_text = "bytes intact" if bad == 0 else f"{bad} words CHANGED"
        print(
            f"round {i}: moved (NVML) {moved_text}, freed on the GPUs {freed_text}, {intact_text}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="device memory to fill (GiB)")
    parser.add_argument("--rounds", type=int, default=3, help="snapshot/restore rounds")
    parser.add_argument("--device", type=int, default=0, help="the child's CUDA device ordinal")
    parser.add_argument("--repeats", type=int, default=3, help="pinned copies each way (best kept)")
    parser.add_argument("--deadline", type=float, default=280.0, help="give up after (seconds)")
    parser.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.gib, args.device, args.repeats)
    if args.gib <= 0 or args.rounds < 1 or args.repeats < 1:
        parser.error("--gib must be positive, --rounds and --repeats at least 1")

    async def bounded() -> dict[str, Any]:
        async with asyncio.timeout(args.deadline):
            return await run(args)

    from timeslice.errors import TimeSliceError

    started = time.monotonic()
    try:
        result = asyncio.run(bounded())
    except (TimeSliceError, RuntimeError) as exc:  # the backend's errors, the child's
        print(f"cuda_checkpoint: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"cuda_checkpoint: did not finish within {args.deadline:g} s", file=sys.stderr)
        return 1
    result["wall_s"] = time.monotonic() - started
    print_table(result)
    print(f"\n{result['wall_s']:.1f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["intact"] else 1


if __name__ == "__main__":
    sys.exit(main())
