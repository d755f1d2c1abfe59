"""Reading a call's header blocks: our one-pass reader against `hpack`'s decoder.

    python benchmarks/header_blocks.py --json OUT [--repeats 20000] [--quick]

The blocks are those of one unary call as our ends write them
(`timeslice.api.header_blocks.header_block`): an Acquire's request headers (what
the server reads), its answer's headers and its trailers (what the client reads).
Each is read `--repeats` times, in alternating rounds, by the reader a
connection uses (`BlockReader`: one pass over a plain block) and by `hpack`'s
`Decoder` alone, as every connection read them before; both give the same
fields, which the run checks. CPU time per read, median of the rounds, in this
process (no I/O, so the machine's noise is what moves it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import hpack  # noqa: E402

from benchmarks.common import (  # noqa: E402
    Row,
    add_common_arguments,
    describe,
    format_table,
    machine,
    run_main,
)
from timeslice.api.h2core import Limits  # noqa: E402
from timeslice.api.header_blocks import BlockReader, header_block  # noqa: E402

ROUNDS = 9
# One unary call's blocks, as the client and the orchestrator write them.
REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/Acquire"),
    (":authority", "127.0.0.1:50051"),
    ("te", "trailers"),
    ("content-type", "application/grpc"),
    ("grpc-timeout", "29999m"),
]
RESPONSE = [(":status", "200"), ("content-type", "application/grpc")]
TRAILERS = [("grpc-status", "0")]
BLOCKS = {"request": REQUEST, "response": RESPONSE, "trailers": TRAILERS}


def per_read(read: Any, block: bytes, repeats: int) -> float:
    """CPU seconds per `read(block)`, over `repeats` reads."""
    t0 = time.process_time()
    for _ in range(repeats):
        read(block)
    return (time.process_time() - t0) / repeats


async def run(args: argparse.Namespace) -> dict[str, Any]:
    limits = Limits()  # a connection's defaults
    result: dict[str, Any] = {"machine": machine(), "repeats": args.repeats, "rounds": ROUNDS}
    for name, headers in BLOCKS.items():
        block = header_block(headers)
        reader = BlockReader(limits.max_header_list_size, limits.header_table_size)
        decoder = hpack.Decoder(max_header_list_size=limits.max_header_list_size)
        decoder.max_allowed_table_size = limits.header_table_size

        def by_hpack(data: bytes, decoder: hpack.Decoder = decoder) -> Any:
            return decoder.decode(data, raw=False)

        if not reader.read(block) == by_hpack(block) == headers:
            raise RuntimeError(f"the {name} block is not read as hpack reads it")
        ours, theirs = [], []
        for _ in range(ROUNDS):  # alternating: both share the machine's load
            ours.append(per_read(reader.read, block, args.repeats))
            theirs.append(per_read(by_hpack, block, args.repeats))
        result[name] = {
            "bytes": len(block),
            "fields": len(headers),
            "ours_us": statistics.median(ours) * 1e6,
            "hpack_us": statistics.median(theirs) * 1e6,
        }
    return result


def summary(r: dict[str, Any]) -> list[Row]:
    rows = []
    for name, what in [("request", "a request's headers (the server reads)"),
                       ("response", "an answer's headers (the client reads)"),
                       ("trailers", "an answer's trailers (the client reads)")]:  # fmt: skip
        b = r[name]
        rows.append(Row(f"reading {what}", b["ours_us"], b["hpack_us"], "µs",
                        f"baseline: hpack's Decoder; {b['fields']} field(s), {b['bytes']} bytes; "
                        f"CPU per read, median of {r['rounds']} rounds of {r['repeats']}"))  # fmt: skip
    return rows


def print_table(r: dict[str, Any]) -> None:
    print(f"timeslice header-block benchmark: {describe(r['machine'])}")
    print()
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--repeats", type=int, default=20_000, help="reads per round")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2_000)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
