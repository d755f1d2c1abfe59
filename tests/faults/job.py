"""One job of the fault campaign, in a process of its own.

    python -m tests.faults.job --orchestrator HOST:PORT --agent HOST:PORT --job NAME \
        --group g --log PATH [--mib 4] [--lease 2] [--seed S]

The job registers a host-memory context with its node's agent, then loops: it
acquires the group with a short lease, checks inside the hold that its context
holds exactly the bytes it last wrote (a snapshot and restore in between must
bring them back whole), writes a new pattern, works in a few short steps, and
releases. After every hold it appends one JSON line to its log: its fencing
token, when the hold began and ended, each step's time, what the checks found,
and whether the release was accepted. Only a hold whose release was accepted
counts as confirmed: a holder that was frozen past its lease learns at the
release, at the latest, that its grant is gone. The campaign's checker reads
these lines beside the orchestrator's journal.

SIGTERM ends the job cleanly; SIGKILL and SIGSTOP are what the campaign tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np
import numpy.typing as npt

from timeslice.client import AsyncTimeSliceOrchestratorClient, register_workload
from timeslice.client.types import AcquireResult
from timeslice.errors import TimeSliceError
from timeslice.workloads import HostMemoryWorkload
from timeslice.workloads.hostmem import ArraySavedError

ARRAY: Final = "context"
# What a check inside a hold finds.
OK: Final = "ok"
CORRUPT: Final = "corrupt"  # bytes other than the ones this process last wrote
SAVED: Final = "saved"  # the context was out of memory while the job held the group


class GuardedContext:
    """A `HostMemoryWorkload` whose snapshot and restore take the same lock as the
    job's own check-and-write, so that a snapshot sees the job's last write whole
    or not at all: whatever comes back must equal exactly one pattern the job wrote,
    even for a holder that wakes from SIGSTOP while its snapshot is carried out."""

    supported_modes: tuple[str, ...] = ("offload",)
    default_mode: str = "offload"

    def __init__(self, store: Path, nbytes: int, salt: int) -> None:
        self.memory = HostMemoryWorkload(store)
        self._base = np.arange(max(1, nbytes // 8), dtype=np.uint64)
        self._salt = salt
        self._lock = threading.Lock()
        self.memory.allocate(ARRAY, self._base.shape, np.uint64)[:] = self._pattern(0)
        self.written = 0  # the round whose pattern the context holds
        self.snapshots = self.restores = 0

    @property
    def state(self) -> str:
        return self.memory.state

    def snapshot(self, mode: str, tags: Iterable[str]) -> tuple[int, int]:
        with self._lock:
            moved = self.memory.snapshot(mode, tags)
            self.snapshots += 1
            return moved

    def restore(self, tags: Iterable[str]) -> tuple[int, int]:
        with self._lock:
            moved = self.memory.restore(tags)
            self.restores += 1
            return moved

    def check_and_write(self, round_: int) -> tuple[str, str]:
        """(what the context held, whether the new pattern went in)."""
        with self._lock:
            try:
                array = self.memory[ARRAY]
            except ArraySavedError:
                return SAVED, SAVED
            found = OK if np.array_equal(array, self._pattern(self.written)) else CORRUPT
            array[:] = self._pattern(round_)
            self.written = round_
            return found, OK

    def check(self) -> str:
        with self._lock:
            try:
                array = self.memory[ARRAY]
            except ArraySavedError:
                return SAVED
            return OK if np.array_equal(array, self._pattern(self.written)) else CORRUPT

    def _pattern(self, round_: int) -> npt.NDArray[np.uint64]:
        # Distinct per process and round, and different in every element.
        return self._base + np.uint64((round_ << 32) | self._salt)


class HoldLog:
    """One JSON object a line, flushed at once: a SIGKILL loses no finished line."""

    def __init__(self, path: Path, job: str) -> None:
        self._file: TextIO = path.open("a", encoding="utf-8")
        self.job = job

    def write(self, kind: str, **fields: Any) -> None:
        line = {"kind": kind, "job": self.job, "pid": os.getpid(), "time": time.time(), **fields}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Job:
    """The acquire, check, work, release loop of one job."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(f"{args.seed}/{args.job}/{os.getpid()}")
        self.log = HoldLog(Path(args.log), args.job)
        salt = (sum(args.job.encode()) % 256) << 24 | (os.getpid() & 0xFFFFFF)
        self.context = GuardedContext(Path(args.store), args.mib * 1024 * 1024, salt)
        self.token = 0
        self.client = AsyncTimeSliceOrchestratorClient(
            args.orchestrator,
            job_id=args.job,
            group_id=args.group,
            lease_ttl_sec=args.lease,
            on_lease_lost=self._lease_lost,
        )

    def _lease_lost(self, group: str, job: str, error: TimeSliceError) -> None:
        self.log.write("lease_lost", token=self.token, error=_describe(error))

    async def run(self) -> None:
        registration = await register_workload(
            self.args.agent, self.args.job, self.args.group, self.context
        )
        self.log.write("start", agent=self.args.agent)
        try:
            round_ = 0
            while True:
                round_ += 1
                await self._one_hold(round_)
                # The job's work away from the accelerators.
                await asyncio.sleep(self.rng.uniform(0.05, 0.4))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(registration.close(), 3)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.close(), 3)

    async def _one_hold(self, round_: int) -> None:
        record: dict[str, Any] | None = None
        try:
            async with self.client.acquire() as grant:
                record = await self._hold(grant, round_)
        except TimeSliceError as exc:
            if record is None:
                self.log.write("acquire_error", round=round_, error=_describe(exc))
                await asyncio.sleep(0.2)
                return
            record.update(confirmed=False, release_error=_describe(exc))
        else:
            assert record is not None
            record.update(confirmed=True, release_error="")
        self.log.write("hold", **record)

    async def _hold(self, grant: AcquireResult, round_: int) -> dict[str, Any]:
        start = time.time()
        self.token = grant.fencing_token
        found, wrote = self.context.check_and_write(round_)
        steps: list[float] = []
        for _ in range(self.rng.randint(2, 4)):
            # A job that knows its lease is gone stops working as the holder; one
            # frozen past its lease does not know until a renewal is refused.
            if self.client.lease_lost():
                break
            steps.append(time.time())
            await asyncio.sleep(self.rng.uniform(0.03, 0.1))
        after = self.context.check()
        return {
            "token": grant.fencing_token,
            "round": round_,
            "start": start,
            "end": time.time(),
            "steps": steps,
            "restored": grant.context_restored,
            "found": found,
            "wrote": wrote,
            "after": after,
            "lost_in_hold": self.client.lease_lost(),
        }


def _describe(error: BaseException) -> str:
    message = getattr(error, "message", "") or str(error)
    return f"{type(error).__name__}: {message}"[:300]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.job", description=__doc__)
    parser.add_argument("--orchestrator", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--group", default="g")
    parser.add_argument("--log", required=True)
    parser.add_argument("--store", required=True, help="where the context is offloaded")
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--seed", default="0")
    return parser.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job = Job(args)
    task = asyncio.ensure_future(job.run())
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    try:
        await task
    except BaseException as exc:
        if not (stopping and isinstance(exc, asyncio.CancelledError)):
            # The checker counts a job that dies on its own as a failure: say why.
            job.log.write("crash", error=_describe(exc), traceback=traceback.format_exc())
            return 1
    finally:
        job.log.write("stop", stopping=stopping)
        job.log.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
