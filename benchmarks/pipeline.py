"""What pipelining buys a switch on a GPU, by the agent's own model of it: the
time of a switch moved tag by tag (the next holder's tags coming in as the
other's go out), beside the same switch moved whole.

    python benchmarks/pipeline.py --json OUT [--gib 64] [--gbps 55] [--step-ms 2] [--cut 8]

A model, not a measurement: `timeslice.agent.pipeline.model` runs the rule the
agent runs (a tag comes in once the outgoing steps have freed room for it) over
a full-duplex link of `--gbps` GB/s each way (PCIe 5.0 x16 gives about 55 in
practice), each step costing `--step-ms` of its own (a workload command's round
trip). The tags are those of real states of `--gib` GiB each, and the same
states with each tag cut in `--cut` (a tag per group of layers, say): a switch
moved tag by tag ends no sooner than the outgoing's first step plus the whole
restore, so the finer the tags, the nearer it comes to the larger transfer
alone. What a GPU really does is measured by `benchmarks/gpu/pipelined_switch.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import Row, run_main  # noqa: E402
from timeslice.agent.pipeline import model  # noqa: E402

GIB = 1 << 30

# name: (outgoing tags, incoming tags), each as shares of the state, in declared order.
LAYOUTS: dict[str, tuple[dict[str, float], dict[str, float]]] = {
    "two Adam training states (weights 1/4, grads 1/4, optimizer 1/2)": (
        {"grads": 0.25, "optimizer": 0.5, "weights": 0.25},
        {"grads": 0.25, "optimizer": 0.5, "weights": 0.25},
    ),
    "two host-memory workloads (1/2, 1/4, 3/16, 1/16)": (
        {"kv_cache": 0.25, "lora": 1 / 16, "optimizer": 3 / 16, "weights": 0.5},
        {"kv_cache": 0.25, "lora": 1 / 16, "optimizer": 3 / 16, "weights": 0.5},
    ),
    "a trainer out (Adam), an inference engine in (weights 1/4, kv_cache 3/4)": (
        {"grads": 0.25, "optimizer": 0.5, "weights": 0.25},
        {"kv_cache": 0.75, "weights": 0.25},
    ),
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bw = args.gbps * 1e9
    step = args.step_ms / 1000
    size = round(args.gib * GIB)

    def switch(outgoing: list[float], incoming: list[float], pipelined: bool) -> float:
        out = [round(share * size) for share in outgoing]
        into = [round(share * size) for share in incoming]
        return model(out, into, d2h=bw, h2d=bw, pipelined=pipelined, step_cost=step).end

    cases = {}
    for name, (out, into) in LAYOUTS.items():
        # Each tag cut in `--cut` tags of its own (a tag per layer group, say).
        finer_out = [share / args.cut for share in out.values() for _ in range(args.cut)]
        finer_in = [share / args.cut for share in into.values() for _ in range(args.cut)]
        cases[name] = {
            "moved whole": switch([1.0], [1.0], False),
            "by tag": switch(list(out.values()), list(into.values()), True),
            "finer tags": switch(finer_out, finer_in, True),
            "one way": size / bw,
        }
    return {"parameters": {k: str(v) if isinstance(v, Path) else v
                           for k, v in vars(args).items()}, "cases": cases}  # fmt: skip


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"modelled switches: {p['gib']:g} GiB each way, {p['gbps']:g} GB/s each way (full"
          f" duplex), {p['step_ms']:g} ms a step")  # fmt: skip
    finer = f"tags/{p['cut']}"
    print(f"\n{'states':74} {'whole':>8} {'by tag':>8} {finer:>8} {'one way':>8}")
    for name, c in r["cases"].items():
        print(f"{name:74} {c['moved whole']:7.3f}s {c['by tag']:7.3f}s"
              f" {c['finer tags']:7.3f}s {c['one way']:7.3f}s")  # fmt: skip


def summary(r: dict[str, Any]) -> list[Row]:
    p = r["parameters"]
    note = (f"a model, not a measurement: {p['gib']:g} GiB each way over {p['gbps']:g} GB/s"
            f" each way, {p['step_ms']:g} ms a step")  # fmt: skip
    rows = []
    for name, c in r["cases"].items():
        rows.append(Row(f"modelled switch, {name}: tag by tag", c["by tag"],
                        c["moved whole"], "s", f"baseline: moved whole; {note}"))  # fmt: skip
    adam = next(iter(r["cases"].values()))
    rows.append(Row(f"modelled switch, two Adam states, each tag cut in {p['cut']}",
                    adam["finer tags"], adam["one way"], "s",
                    "baseline: the larger of the two transfers alone (the ceiling)"))  # fmt: skip
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="the same (it takes no time)")
    parser.add_argument("--gib", type=float, default=64.0, help="each state's size")
    parser.add_argument("--gbps", type=float, default=55.0, help="the link, each way")
    parser.add_argument("--step-ms", type=float, default=2.0, help="a step's own cost")
    parser.add_argument("--cut", type=int, default=8, help="finer tags: each tag cut in N")
    args = parser.parse_args(argv)
    if not (args.gib > 0 and args.gbps > 0 and args.step_ms >= 0 and 1 <= args.cut <= 64):
        parser.error("--gib and --gbps must be positive, --step-ms not negative, --cut 1-64")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
