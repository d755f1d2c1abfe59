"""TorchWorkload on a real GPU: snapshot and restore bandwidth of a training state
beside a pinned ``copy_`` of the same bytes, the device memory each gives back,
and the bytes coming back intact.

    python benchmarks/gpu/torch_workload_cuda.py [--gib 4] [--rounds 3] [--device 0] [--json OUT]

The state is a stack of 4096x4096 linear layers (fp32), each with a rank-16 LoRA
adapter beside it, trained one step with Adam on the device: a quarter weights, a
quarter gradients, half the optimizer's state, about `--gib` GiB together. Each
round:
- a pinned copy: every byte of the same size, device to pinned host memory and
  back (``copy_(non_blocking=True)`` then a synchronize), as the baseline;
- a TorchWorkload snapshot (OFFLOAD of every tag) and restore, with
  ``torch.cuda.memory_allocated`` and the driver's free memory
  (``torch.cuda.mem_get_info``) read before, while saved, and after;
- every tensor compared, byte for byte, with a host copy taken before the rounds.
Then one snapshot and restore per tag (weights, optimizer, grads, lora): the bytes
each moves and its bandwidth.

Rates are GB/s (10^9 bytes a second) of the bytes moved. Needs torch with CUDA and
a CUDA device; exits with status 2 and says why without them. Finishes within
about two minutes for the default size on a recent GPU (`--deadline`, default 110
s: no new round starts after it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # timeslice from this checkout

from benchmarks.gpu._torch_cuda import cuda_device  # noqa: E402

GB = 1e9
GIB = 1 << 30
WIDTH = 4096
RANK = 16
TAGS = ("weights", "optimizer", "grads", "lora")


def build_state(gib: float, device: Any) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    from timeslice.workloads.torch import TorchWorkload

    layer_bytes = 4 * (WIDTH * WIDTH + 2 * WIDTH * RANK + WIDTH)
    layers = max(1, round(gib * GIB / 4 / layer_bytes))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = nn.Linear(WIDTH, WIDTH, device=device)
            self.lora_a = nn.Linear(WIDTH, RANK, bias=False, device=device)
            self.lora_b = nn.Linear(RANK, WIDTH, bias=False, device=device)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.base(x) + self.lora_b(self.lora_a(x))

    torch.manual_seed(0)
    model = nn.Sequential(*(Block() for _ in range(layers)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(8, WIDTH, device=device)).square().mean().backward()
    opt.step()
    torch.cuda.synchronize(device)
    workload = TorchWorkload()
    workload.add_module(
        model, name="model", param_tags=lambda name, p: ("lora",) if "lora_" in name else ()
    )
    workload.add_optimizer(opt, name="adam")
    return model, opt, workload


def every_tensor(model: Any, opt: Any) -> list[Any]:
    found = [p for p in model.parameters()]
    found += [p.grad for p in model.parameters() if p.grad is not None]
    found += [v for state in opt.state.values() for v in state.values()]
    return found


def pinned_copy(nbytes: int, device: Any) -> tuple[float, float]:
    """Seconds for a pinned copy of `nbytes` device -> host and host -> device."""
    import torch

    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    host.copy_(source, non_blocking=True)
    torch.cuda.synchronize(device)
    down = time.perf_counter() - start
    start = time.perf_counter()
    source.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    up = time.perf_counter() - start
    return down, up


def memory(device: Any) -> dict[str, int]:
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return {"allocated": torch.cuda.memory_allocated(device), "driver_free": free, "total": total}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = cuda_device(args.device)
    started = time.monotonic()
    model, opt, workload = build_state(args.gib, device)
    nbytes = workload.moved_bytes([])
    expected = [t.detach().cpu().clone() for t in every_tensor(model, opt)]
    pinned_copy(min(nbytes, GIB), device)  # warm up the pinned allocator and the copy engines
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        if rounds and time.monotonic() - started > args.deadline:
            break
        down, up = pinned_copy(nbytes, device)
        torch.cuda.empty_cache()
        before = memory(device)
        start = time.perf_counter()
        stored, freed = workload.snapshot("offload", [])
        snapshot_s = time.perf_counter() - start
        saved = memory(device)
        start = time.perf_counter()
        read, allocated = workload.restore([])
        restore_s = time.perf_counter() - start
        after = memory(device)
        intact = all(
            torch.equal(t.detach().cpu(), e) for t, e in zip(every_tensor(model, opt), expected)
        )
        rounds.append({
            "pinned_down_s": down, "pinned_up_s": up,
            "snapshot_s": snapshot_s, "restore_s": restore_s,
            "reported": {"stored": stored, "freed": freed, "read": read, "allocated": allocated},
            "memory": {"before": before, "saved": saved, "after": after},
            "allocated_freed": before["allocated"] - saved["allocated"],
            "driver_freed": saved["driver_free"] - before["driver_free"],
            "intact": intact,
        })  # fmt: skip
    tags: dict[str, Any] = {}
    for tag in TAGS:
        start = time.perf_counter()
        stored, freed = workload.snapshot("offload", [tag])
        snapshot_s = time.perf_counter() - start
        start = time.perf_counter()
        workload.restore([tag])
        tags[tag] = {"bytes": stored, "freed": freed, "snapshot_s": snapshot_s,
                     "restore_s": time.perf_counter() - start}  # fmt: skip
    med = {key: statistics.median(r[key] for r in rounds)
           for key in ("pinned_down_s", "pinned_up_s", "snapshot_s", "restore_s")}  # fmt: skip
    return {
        "parameters": vars(args),
        "machine": {
            "gpu": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "bytes": nbytes,
        "rounds": rounds,
        "pinned_down_gbps": nbytes / med["pinned_down_s"] / GB,
        "pinned_up_gbps": nbytes / med["pinned_up_s"] / GB,
        "snapshot_gbps": nbytes / med["snapshot_s"] / GB,
        "restore_gbps": nbytes / med["restore_s"] / GB,
        "all_intact": all(r["intact"] for r in rounds),
        "tags": tags,
        "wall_s": time.monotonic() - started,
    }


def print_table(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"TorchWorkload on {m['gpu']}: torch {m['torch']}, CUDA {m['cuda']}")
    title = f"{r['bytes'] / GIB:.2f} GiB training state, median of {len(r['rounds'])}"
    print(f"\n{title:48} {'GB/s':>10} {'vs pinned':>10}")
    for label, ours, base in (
        ("snapshot (offload to pinned host memory)", r["snapshot_gbps"], r["pinned_down_gbps"]),
        ("pinned copy_ device -> host", r["pinned_down_gbps"], r["pinned_down_gbps"]),
        ("restore (new device memory)", r["restore_gbps"], r["pinned_up_gbps"]),
        ("pinned copy_ host -> device", r["pinned_up_gbps"], r["pinned_up_gbps"]),
    ):
        print(f"{label:48} {ours:>10.2f} {ours / base:>9.2f}x")
    print(f"\n{'round':6} {'reported freed':>16} {'allocated -':>16} {'driver free +':>16} intact")
    for i, rnd in enumerate(r["rounds"]):
        print(f"{i:<6} {rnd['reported']['freed']:>16,} {rnd['allocated_freed']:>16,}"
              f" {rnd['driver_freed']:>16,} {rnd['intact']}")  # fmt: skip
    print(f"\n{'tags':12} {'bytes':>16} {'snapshot GB/s':>14} {'restore GB/s':>14}")
    for tag, t in r["tags"].items():
        snap = t["bytes"] / t["snapshot_s"] / GB if t["snapshot_s"] else 0.0
        back = t["bytes"] / t["restore_s"] / GB if t["restore_s"] else 0.0
        print(f"{tag:12} {t['bytes']:>16,} {snap:>14.2f} {back:>14.2f}")
    print(f"\nevery byte back intact: {r['all_intact']}; {r['wall_s']:.1f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="size of the training state")
    parser.add_argument("--rounds", type=int, default=3, help="snapshot/restore rounds")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index")
    parser.add_argument("--deadline", type=float, default=110.0, help="no round starts after")
    parser.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    args = parser.parse_args(argv)
    if not 0 < args.gib <= 64 or not 1 <= args.rounds <= 20:
        parser.error("--gib must be in (0, 64] and --rounds from 1 to 20")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["all_intact"] else 1


if __name__ == "__main__":
    sys.exit(main())
