"""TorchWorkload benchmark on CPU: what moving a training state costs, against what
copying its bytes costs.

    python benchmarks/torch_workload.py --json OUT [--mib 256 1024] [--cycles 5] [--quick]

For each size, a model-sized training state of that many bytes: a stack of
2048x2048 linear layers, each with a rank-16 LoRA adapter beside it, trained one
step with Adam, so that a quarter of the bytes are weights, a quarter gradients and
half the optimizer's state. Side by side, medians of `--cycles` runs (after one
that warms up):
- TorchWorkload snapshot (OFFLOAD of every tag: copied to a host buffer, the
  original freed) and restore (new memory, the bytes copied back), as GB/s of the
  state's bytes;
- a plain ``tensor.copy_`` of the same bytes into new memory (what a move has to
  do: the destination is touched for the first time), and into memory already
  touched (the copy alone).
And the bytes each tag selection moves (all, weights, optimizer, grads, lora), as
reported by the workload's snapshot, beside ``moved_bytes`` asked beforehand.
Everything runs in this process; on CPU a tensor's "device" memory is its storage.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import Row, add_common_arguments, describe, machine, run_main  # noqa: E402

MiB = 1024**2
WIDTH = 2048
RANK = 16
TAGS = ("all", "weights", "optimizer", "grads", "lora")


def build_state(mib: int) -> tuple[Any, Any, Any]:
    """A model and its Adam optimizer of about `mib` MiB of training state, trained
    one step, held by a TorchWorkload (LoRA parameters tagged ``lora``)."""
    import torch
    from torch import nn

    from timeslice.workloads.torch import TorchWorkload

    layer_bytes = 4 * (WIDTH * WIDTH + 2 * WIDTH * RANK + WIDTH)  # weight, adapter, bias
    layers = max(1, round(mib * MiB / 4 / layer_bytes))  # a quarter of the state is weights

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = nn.Linear(WIDTH, WIDTH)
            self.lora_a = nn.Linear(WIDTH, RANK, bias=False)
            self.lora_b = nn.Linear(RANK, WIDTH, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.base(x) + self.lora_b(self.lora_a(x))

    torch.manual_seed(0)
    with torch.no_grad():
        model = nn.Sequential(*(Block() for _ in range(layers)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, WIDTH)).square().mean().backward()
    opt.step()
    workload = TorchWorkload()
    workload.add_module(
        model, name="model", param_tags=lambda name, p: ("lora",) if "lora_" in name else ()
    )
    workload.add_optimizer(opt, name="adam")
    return model, opt, workload


def measure_workload(mib: int, cycles: int) -> dict[str, Any]:
    _, _, workload = build_state(mib)
    nbytes = workload.moved_bytes([])
    snaps, restores = [], []
    for _ in range(cycles + 1):  # the first warms up, and is not counted
        gc.collect()
        start = time.perf_counter()
        stored, freed = workload.snapshot("offload", [])
        snaps.append(time.perf_counter() - start)
        if (stored, freed) != (nbytes, nbytes):
            raise RuntimeError(f"snapshot moved {stored}/{freed} bytes, not {nbytes}")
        start = time.perf_counter()
        read, allocated = workload.restore([])
        restores.append(time.perf_counter() - start)
        if (read, allocated) != (nbytes, nbytes):
            raise RuntimeError(f"restore moved {read}/{allocated} bytes, not {nbytes}")
    snaps, restores = snaps[1:], restores[1:]
    tags = {}
    for name in TAGS:
        selection = [] if name == "all" else [name]
        asked = workload.moved_bytes(selection)
        stored, _ = workload.snapshot("offload", selection)
        workload.restore(selection)
        tags[name] = {"snapshot_bytes": stored, "moved_bytes": asked}
    workload.close()
    return {
        "bytes": nbytes,
        "snapshot_s": snaps,
        "restore_s": restores,
        "snapshot_gbps": nbytes / statistics.median(snaps) / 1e9,
        "restore_gbps": nbytes / statistics.median(restores) / 1e9,
        "tags": tags,
    }


def measure_copy(nbytes: int, cycles: int) -> dict[str, float]:
    """``copy_`` of `nbytes` into new memory, and into memory already touched: GB/s."""
    import torch

    source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    fresh, touched = [], []
    target = torch.zeros(nbytes, dtype=torch.uint8)
    for _ in range(cycles + 1):  # the first warms up, and is not counted
        gc.collect()
        start = time.perf_counter()
        new = torch.empty(nbytes, dtype=torch.uint8)
        new.copy_(source)
        fresh.append(time.perf_counter() - start)
        del new
        start = time.perf_counter()
        target.copy_(source)
        touched.append(time.perf_counter() - start)
    return {
        "copy_new_gbps": nbytes / statistics.median(fresh[1:]) / 1e9,
        "copy_touched_gbps": nbytes / statistics.median(touched[1:]) / 1e9,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    results: dict[str, Any] = {
        "parameters": vars(args),
        "machine": {**machine(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "sizes": [],
    }
    for mib in args.mib:
        ours = measure_workload(mib, args.cycles)
        gc.collect()
        copy = measure_copy(ours["bytes"], args.cycles)
        ours.update(copy)
        ours["snapshot_over_copy"] = ours["snapshot_gbps"] / copy["copy_new_gbps"]
        ours["restore_over_copy"] = ours["restore_gbps"] / copy["copy_new_gbps"]
        results["sizes"].append({"mib": mib, **ours})
    return results


def print_table(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"TorchWorkload on CPU: {describe(m)}, torch {m['torch']} ({m['threads']} threads)")
    runs = r["parameters"]["cycles"]
    for size in r["sizes"]:
        title = f"{size['bytes'] / MiB:,.0f} MiB training state, median of {runs}"
        print(f"\n{title:48} {'GB/s':>10} {'vs copy':>10}")
        base = size["copy_new_gbps"]
        for label, value in (
            ("snapshot (offload to host memory, freed)", size["snapshot_gbps"]),
            ("restore (new memory, byte-exact)", size["restore_gbps"]),
            ("plain copy_ into new memory", size["copy_new_gbps"]),
            ("plain copy_ into memory already touched", size["copy_touched_gbps"]),
        ):
            print(f"{label:48} {value:>10.2f} {value / base:>9.2f}x")
        print(f"\n{'tags':12} {'snapshot moved':>16} {'moved_bytes()':>16} {'share':>8}")
        for name, moved in size["tags"].items():
            share = moved["snapshot_bytes"] / size["bytes"]
            print(f"{name:12} {moved['snapshot_bytes']:>16,} {moved['moved_bytes']:>16,}"
                  f" {share:>7.1%}")  # fmt: skip


def summary(r: dict[str, Any]) -> list[Row]:
    """The suite's rows: snapshot and restore bandwidth against a copy_ into new memory."""
    rows = []
    for size in r["sizes"]:
        note = (f"baseline: copy_ of the same bytes into new memory; {size['bytes'] / MiB:,.0f}"
                f" MiB, median of {r['parameters']['cycles']}")  # fmt: skip
        rows.append(Row(f"TorchWorkload snapshot, {size['mib']} MiB (CPU)",
                        size["snapshot_gbps"], size["copy_new_gbps"], "GB/s", note))  # fmt: skip
        rows.append(Row(f"TorchWorkload restore, {size['mib']} MiB (CPU)",
                        size["restore_gbps"], size["copy_new_gbps"], "GB/s", note))  # fmt: skip
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--mib", type=int, nargs="+", default=[256, 1024],
                        help="sizes of the training state, MiB")  # fmt: skip
    parser.add_argument("--cycles", type=int, default=5, help="snapshot/restore cycles measured")
    args = parser.parse_args(argv)
    if any(not 1 <= mib <= 64 * 1024 for mib in args.mib) or not 1 <= args.cycles <= 100:
        parser.error("--mib must be from 1 to 65536 and --cycles from 1 to 100")
    if args.quick:
        args.mib, args.cycles = [min(args.mib[0], 64)], min(args.cycles, 3)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
