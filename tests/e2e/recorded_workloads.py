"""Host-memory workloads that record, per node, which contexts are live: what the
switch tests check "never two live contexts on a node" against."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from timeslice.workloads import HostMemoryWorkload

ELEMENTS = 16 * 1024  # 128 KiB per array


@dataclass
class NodeRecord:
    """What one node saw: the contexts live on it now, and every violation."""

    name: str
    live: set[str] = field(default_factory=set)
    most_live: int = 0
    violations: list[str] = field(default_factory=list)
    restores: int = 0


class RecordedWorkload:
    """A host-memory workload that tells its node's record when it moves."""

    def __init__(
        self, job: str, record: NodeRecord, store: Path, gate: threading.Event | None = None
    ) -> None:
        self.job, self.record = job, record
        # With a gate, a restore waits for it (set `restoring` first): a test can
        # stop the world in the middle of a switch.
        self.gate, self.restoring = gate, threading.Event()
        self.memory = HostMemoryWorkload(store)
        self.memory.allocate("weights", ELEMENTS, np.float64)
        self.memory["weights"][:] = -1.0
        self.memory.snapshot()  # the job starts with its context saved
        self.written = -1.0

    @property
    def state(self) -> str:
        return self.memory.state

    def snapshot(self, mode: str, tags: Iterable[str]) -> tuple[int, int]:
        moved = self.memory.snapshot(mode, tags)
        self.record.live.discard(self.job)
        return moved

    def restore(self, tags: Iterable[str]) -> tuple[int, int]:
        self.restoring.set()
        if self.gate is not None:
            assert self.gate.wait(30), f"{self.job}: the restore was never let through"
        others = self.record.live - {self.job}
        if others:
            self.record.violations.append(f"{self.job} restored while {others} live")
        moved = self.memory.restore(tags)
        self.record.live.add(self.job)
        self.record.most_live = max(self.record.most_live, len(self.record.live))
        self.record.restores += 1
        return moved

    def check_and_write(self, value: float) -> None:
        weights = self.memory["weights"]
        assert np.all(weights == self.written), f"{self.job}: restored bytes differ"
        weights[:] = value
        self.written = value
