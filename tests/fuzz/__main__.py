"""`python -m tests.fuzz --requests N --seed S`: a longer fuzz run; prints the
statuses by route as a table, then the report as JSON. Exits 1 on a finding."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from .fuzzer import fuzz


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=16)
    options = parser.parse_args(argv)
    report = asyncio.run(fuzz(options.requests, options.seed, options.concurrency))
    print(report.table())
    print(json.dumps(report.to_json(), indent=2))
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
