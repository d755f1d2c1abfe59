"""A job process for tests of the agent: a host-memory workload of N MiB of
deterministic random bytes, registered with an agent, answering line commands.

    python tests/workloads/hostmem_worker.py --agent HOST:PORT --job J [--group G]
        [--mib 512] [--seed S] [--store DIR] [--store-kind file|memory] [--one-step]

Prints one JSON line when registered, ``{"pid": ..., "ready": true, "bytes": ...,
"arrays": {name: [tags]}}``, then reads commands on stdin, one a line, and answers
each with one JSON line:

    rss     {"rss_bytes": N}                 the process's resident memory now
    verify  {"ok": true|false, ...}          every byte against the seed
    state   {"state": "RUNNING"|"SAVED", "connected": bool, "saved": [names]}
    acquire ORCHESTRATOR TTL
            {"granted": true, "fencing_token": N, "context_restored": bool}
                                             the job takes its group's lock; TTL in
                                             seconds, or "none" for no lease at all
                                             (as a v1alpha1 client: no keepalives)
    quit    {"bye": true}                    (end of input does the same)

Its store is files (in DIR, or a temporary directory), so that a snapshot takes
the bytes out of the process's memory, unless ``--store-kind memory``. It
registers as moving its context tag by tag (pipelined switches), unless
``--one-step``.

The workload's arrays: weights (1/2 of the bytes), kv_cache (1/4), optimizer
(3/16) and lora (1/16), each tagged with its name.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from timeslice import TimeSliceOrchestratorClient
from timeslice.client.workload import register_workload_in_thread
from timeslice.workloads import ArraySavedError, HostMemoryWorkload

MiB = 1024 * 1024
CHUNK = 16 * MiB

# name, share of the bytes in sixteenths, dtype
LAYOUT: list[tuple[str, int, Any]] = [
    ("weights", 8, np.float32),
    ("kv_cache", 4, np.uint8),
    ("optimizer", 3, np.int64),
    ("lora", 1, np.float16),
]


def chunks(seed: int, index: int, size: int) -> Any:
    """The array's bytes, as the seed makes them, a chunk at a time."""
    rng = np.random.default_rng([seed, index])
    for start in range(0, size, CHUNK):
        yield start, np.frombuffer(rng.bytes(min(CHUNK, size - start)), np.uint8)


def build(workload: HostMemoryWorkload, total: int, seed: int) -> None:
    for index, (name, share, dtype) in enumerate(LAYOUT):
        size = total * share // 16
        array = workload.allocate(name, size // np.dtype(dtype).itemsize, dtype, tags=[name])
        flat = array.view(np.uint8)
        for start, data in chunks(seed, index, size):
            flat[start : start + len(data)] = data


def verify(workload: HostMemoryWorkload, total: int, seed: int) -> dict[str, Any]:
    if workload.needs_provision:
        return {"ok": False, "needs_provision": sorted(workload.needs_provision)}
    bad = []
    for index, (name, share, _) in enumerate(LAYOUT):
        try:
            flat = workload[name].view(np.uint8)
        except ArraySavedError:
            return {"ok": False, "saved": sorted(workload.saved)}
        if any(
            not np.array_equal(flat[start : start + len(data)], data)
            for start, data in chunks(seed, index, total * share // 16)
        ):
            bad.append(name)
        del flat
    return {"ok": not bad, "mismatched": bad}


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def answer(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", required=True, help="the agent's HOST:PORT")
    parser.add_argument("--job", required=True)
    parser.add_argument("--group", default="")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", type=Path, default=None, help="where offloaded arrays go")
    parser.add_argument("--store-kind", choices=("file", "memory"), default="file")
    parser.add_argument("--connect-timeout", type=float, default=30.0)
    parser.add_argument(
        "--one-step", action="store_true", help="register as moved whole, not tag by tag"
    )
    args = parser.parse_args()
    if args.mib < 1:
        parser.error("--mib must be at least 1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    total = args.mib * MiB
    workload = HostMemoryWorkload(args.store, store=args.store_kind)
    build(workload, total, args.seed)
    if args.one_step:
        workload.pipelined = False
    handle = register_workload_in_thread(
        args.agent, args.job, args.group, workload, connect_timeout_sec=args.connect_timeout
    )
    try:
        answer(
            {
                "pid": os.getpid(),
                "ready": True,
                "bytes": total,
                "arrays": {name: sorted(workload.tags_of(name)) for name in workload.names},
            }
        )
        for line in sys.stdin:
            command = line.strip()
            if command == "rss":
                answer({"rss_bytes": rss_bytes()})
            elif command == "verify":
                answer(verify(workload, total, args.seed))
            elif command == "state":
                answer(
                    {
                        "state": workload.state,
                        "connected": handle.connected,
                        "saved": sorted(workload.saved),
                    }
                )
            elif command.startswith("acquire "):
                _, target, ttl = command.split()
                lock = TimeSliceOrchestratorClient(
                    target,
                    args.job,
                    args.group,
                    lease_ttl_sec=None if ttl == "none" else float(ttl),
                )
                granted = lock.acquire()
                answer({"granted": granted.success, "fencing_token": granted.fencing_token,
                        "context_restored": granted.context_restored})  # fmt: skip
            elif command == "quit":
                break
            elif command:
                answer({"error": f"unknown command {command!r}"})
    finally:
        handle.close()
        workload.close()
    answer({"bye": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
