"""Pipelined switches on a real GPU: two jobs' device memory swapped through an
agent, tag by tag (the next job's tags coming in as the other's go out) against
moved whole, beside what the copy engines allow.

    python benchmarks/gpu/pipelined_switch.py [--gib 4] [--tags 8] [--rounds 5] [--device 0]
        [--json OUT]

1. The ceiling, in this process: `--gib` GiB device -> pinned host memory, then as
   many bytes host -> device, one after the other; the same two at once on two
   streams (does the link run both ways at once?); and the same cut in `--tags`
   chunks, each chunk in only once the matching chunk is out (what pipelining
   at its finest would give).
2. End to end: an agent (in this process, app_channel backend) and two job
   processes, each a `TorchWorkload` of `--gib` GiB on the device in `--tags`
   tagged tensors. `SwitchGroup` swaps them `--rounds` times, the jobs registered
   as pipelined, then two fresh jobs registered to be moved whole
   (`pipelined = False`). Each job checks every byte against a checksum taken
   before the first switch. Whether the copies of two processes overlap on the
   link (their contexts share the copy engines) is what this measures.

Rates are GB/s (10^9 bytes a second). Needs torch with CUDA and a CUDA device;
exits with status 2 and says why without them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # timeslice from this checkout

from benchmarks.gpu._torch_cuda import cuda_device  # noqa: E402

GB = 1e9
GIB = 1 << 30
SWITCH_TIMEOUT = 120.0


# --- 1. the ceiling ---------------------------------------------------------------------------


def ceiling(nbytes: int, chunks: int, device: Any) -> dict[str, float]:
    """Seconds for: out then in; out and in at once; out and in chunk by chunk."""
    import torch

    size = nbytes // chunks * chunks
    out_dev = torch.empty(size, dtype=torch.uint8, device=device)
    out_host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    in_host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    in_dev = torch.empty(size, dtype=torch.uint8, device=device)
    down, up = torch.cuda.Stream(device), torch.cuda.Stream(device)
    step = size // chunks

    def timed(body: Any) -> float:
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        body()
        torch.cuda.synchronize(device)
        return time.perf_counter() - start

    def serial() -> None:
        out_host.copy_(out_dev, non_blocking=True)
        torch.cuda.synchronize(device)
        in_dev.copy_(in_host, non_blocking=True)

    def both() -> None:
        with torch.cuda.stream(down):
            out_host.copy_(out_dev, non_blocking=True)
        with torch.cuda.stream(up):
            in_dev.copy_(in_host, non_blocking=True)

    def chunked() -> None:
        for k in range(chunks):
            part = slice(k * step, (k + 1) * step)
            with torch.cuda.stream(down):
                out_host[part].copy_(out_dev[part], non_blocking=True)
                left = torch.cuda.Event()
                left.record(down)
            with torch.cuda.stream(up):
                up.wait_event(left)
                in_dev[part].copy_(in_host[part], non_blocking=True)

    timed(serial)  # warm the copy engines and the pinned allocator
    runs: dict[str, list[float]] = {"serial": [], "both": [], "chunked": []}
    for _ in range(3):
        for name, body in (("serial", serial), ("both", both), ("chunked", chunked)):
            runs[name].append(timed(body))
    result = {name: statistics.median(times) for name, times in runs.items()}
    return {**result, "bytes": size}  # its buffers go with it


# --- 2. end to end: a job process ---------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    """One job: `--gib` GiB in `--tags` tensors on the device, registered with the agent."""
    import torch

    from timeslice.client.workload import register_workload_in_thread
    from timeslice.workloads.torch import TorchWorkload

    device = cuda_device(args.device)
    per = int(args.gib * GIB) // args.tags // 4 * 4
    workload = TorchWorkload()
    sums = {}
    generator = torch.Generator(device=device).manual_seed(sum(args.job.encode()))
    for k in range(args.tags):
        tensor = torch.randint(
            0, 2**31 - 1, (per // 4,), dtype=torch.int32, device=device, generator=generator
        )
        sums[f"t{k}"] = int(tensor.sum(dtype=torch.int64))
        workload.add_tensor(f"t{k}", tensor, tags=(f"t{k}",))
    del tensor
    workload.pipelined = not args.one_step
    handle = register_workload_in_thread(args.agent, args.job, args.group, workload)
    print(json.dumps({"ready": True, "bytes": per * args.tags}), flush=True)
    for line in sys.stdin:
        if line.strip() == "verify":
            ok = all(
                int(workload.tensor(name).sum(dtype=torch.int64)) == value
                for name, value in sums.items()
            )
            print(json.dumps({"ok": ok}), flush=True)
        elif line.strip() == "quit":
            break
    handle.close()
    workload.close()
    return 0


class Job:
    def __init__(self, args: argparse.Namespace, agent: str, job: str, group: str, whole: bool):
        command = [sys.executable, __file__, "--worker", "--agent", agent, "--job", job,
                   "--group", group, "--gib", str(args.gib), "--tags", str(args.tags),
                   "--device", str(args.device), *(["--one-step"] if whole else [])]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.name = job

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"job {self.name} ended: status {self.process.wait()}")
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


async def switches(args: argparse.Namespace, whole: bool) -> dict[str, Any]:
    """Two jobs swapped `--rounds` times through an agent; seconds of each switch."""
    from timeslice.agent.server import Agent
    from timeslice.client import AsyncSnapshotAgentClient

    group = "whole" if whole else "pipelined"
    with tempfile.TemporaryDirectory(prefix="timeslice-gpu-") as tmp:
        async with Agent(node_name="gpu", db=f"sqlite:///{tmp}/agent.db",
                         backends=("app_channel",)) as agent:  # fmt: skip
            jobs = [Job(args, agent.address, f"{group}-{n}", group, whole) for n in "ab"]
            try:
                for job in jobs:
                    await asyncio.to_thread(job.read)
                while len(agent.channels) < 2:
                    await asyncio.sleep(0.05)
                async with AsyncSnapshotAgentClient(
                    agent.address, call_timeout_sec=SWITCH_TIMEOUT
                ) as client:
                    times, moved = [], []
                    # The first switch only moves b out; each after it swaps them.
                    for token in range(1, args.rounds + 2):
                        target = jobs[(token - 1) % 2].name
                        start = time.perf_counter()
                        answer = await client.switch_group(
                            group, target, token, timeout_sec=SWITCH_TIMEOUT
                        )
                        took = time.perf_counter() - start
                        if any(s.status.name != "COMPLETE" for s in answer.steps):
                            raise SystemExit(f"a switch step failed: {answer.steps}")
                        if token > 1:
                            times.append(took)
                            moved.append(sum(s.device_bytes for s in answer.steps))
                    intact = {}
                    for job in jobs:  # each once it holds the group
                        await client.switch_group(
                            group,
                            job.name,
                            args.rounds + 10 + len(intact),
                            timeout_sec=SWITCH_TIMEOUT,
                        )
                        intact[job.name] = bool((await asyncio.to_thread(job.ask, "verify"))["ok"])
            finally:
                for job in jobs:
                    await asyncio.to_thread(job.stop)
    return {"switch_s": times, "bytes": moved, "intact": intact}


# --- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = cuda_device(args.device)
    started = time.monotonic()
    limit = ceiling(int(args.gib * GIB), args.tags, device)
    torch.cuda.empty_cache()  # the jobs have the device to themselves
    piped = asyncio.run(switches(args, whole=False))
    whole = asyncio.run(switches(args, whole=True))
    p50 = {name: statistics.median(r["switch_s"]) for name, r in (("piped", piped),
                                                                  ("whole", whole))}  # fmt: skip
    return {
        "parameters": {k: v for k, v in vars(args).items() if k != "worker"},
        "machine": {
            "gpu": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "ceiling_s": limit,
        "pipelined": piped,
        "whole": whole,
        "pipelined_p50_s": p50["piped"],
        "whole_p50_s": p50["whole"],
        "pipelined_over_whole": p50["piped"] / p50["whole"],
        "ceiling_both_over_serial": limit["both"] / limit["serial"],
        "ceiling_chunked_over_serial": limit["chunked"] / limit["serial"],
        "all_intact": all(piped["intact"].values()) and all(whole["intact"].values()),
        "wall_s": time.monotonic() - started,
    }


def print_table(r: dict[str, Any]) -> None:
    m, c = r["machine"], r["ceiling_s"]
    print(f"pipelined switches on {m['gpu']}: torch {m['torch']}, CUDA {m['cuda']}")
    gib = c["bytes"] / GIB
    print(
        f"\nthe copy engines, {gib:.2f} GiB each way, median of 3 {'seconds':>10} {'vs serial':>10}"
    )
    for label, key in (
        ("out, then in", "serial"),
        ("out and in at once", "both"),
        (f"chunk by chunk ({r['parameters']['tags']} chunks)", "chunked"),
    ):
        print(f"{label:48} {c[key]:>10.3f} {c[key] / c['serial']:>9.2f}x")  # fmt: skip
    print(f"\n{'switch through the agent, p50':48} {'seconds':>10} {'vs whole':>10}")
    for label, key in (
        ("tag by tag (pipelined)", "pipelined_p50_s"),
        ("moved whole", "whole_p50_s"),
    ):
        print(f"{label:48} {r[key]:>10.3f} {r[key] / r['whole_p50_s']:>9.2f}x")  # fmt: skip
    moved = statistics.median(r["pipelined"]["bytes"])
    print(f"\nbytes per switch {moved:,.0f}; every byte back intact: {r['all_intact']};"
          f" {r['wall_s']:.1f} s")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="each job's device memory")
    parser.add_argument("--tags", type=int, default=8, help="tensors (tags) per job")
    parser.add_argument("--rounds", type=int, default=5, help="measured switches per mode")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index")
    parser.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agent", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--one-step", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 < args.gib <= 32 or not 1 <= args.tags <= 64 or not 1 <= args.rounds <= 50:
        parser.error("--gib must be in (0, 32], --tags from 1 to 64, --rounds from 1 to 50")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    result = run(args)
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["all_intact"] else 1


if __name__ == "__main__":
    sys.exit(main())
