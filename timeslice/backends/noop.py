"""`noop`: a backend that moves nothing, for tests and control-plane benchmarks.

It keeps each job's state in memory, so it can tell where a context "is" for as
long as the agent runs; after a restart it cannot tell, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timeslice.backends import AcceleratorMemory, BackendContext, JobRef, Moved
from timeslice.errors import InvalidArgumentError


class NoopBackend:
    """Moves nothing; reports zero bytes moved."""

    name = "noop"

    def __init__(self, context: BackendContext) -> None:
        self._states: dict[tuple[str, str], str] = {}

    async def check(self, job: JobRef) -> tuple[str, ...]:
        if job.config:
            raise InvalidArgumentError(
                f"the noop backend takes no options, got {sorted(job.config)}"
            )
        self._states[(job.group, job.job)] = "RUNNING"
        return ()

    async def check_operation(self, job: JobRef, kind: str, params: Mapping[str, Any]) -> None:
        pass

    async def snapshot(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        self._states[(job.group, job.job)] = "SAVED"
        return Moved(storage_bytes=0, device_bytes=0)

    async def restore(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        self._states[(job.group, job.job)] = "RUNNING"
        return Moved(storage_bytes=0, device_bytes=0)

    async def state(self, job: JobRef) -> str | None:
        return self._states.get((job.group, job.job))

    async def accelerators(self) -> list[AcceleratorMemory]:
        return []

    async def close(self) -> None:
        self._states.clear()
