"""`app_channel`: the workload does its own offload, told over its workload channel.

The agent sends the registered workload a snapshot or restore command and waits
for its answer; the bytes moved are what the workload measured and reported
(None if it reported nothing). The suspend mode is resolved from what the
workload registered: unspecified means its default, else offload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timeslice.backends import AcceleratorMemory, BackendContext, JobRef, Moved
from timeslice.errors import ConflictError, InvalidArgumentError

# How long a command may take when the operation gives no deadline of its own.
DEFAULT_TIMEOUT = 300.0


class AppChannelBackend:
    """Snapshot and restore through the job's own workload."""

    name = "app_channel"

    def __init__(self, context: BackendContext) -> None:
        self._channels = context.channels

    async def check(self, job: JobRef) -> tuple[str, ...]:
        if job.config:
            raise InvalidArgumentError(
                f"app_channel takes no job options, got {sorted(job.config)}"
            )
        if self._channels.get(job.group, job.job) is None:
            raise ConflictError(f"job {job.job} has no workload channel open (is it registered?)")
        return ()

    async def check_operation(self, job: JobRef, kind: str, params: Mapping[str, Any]) -> None:
        channel = self._channels.get(job.group, job.job)
        if channel is None:
            raise ConflictError(f"job {job.job} has no workload channel open (is it registered?)")
        if kind == "snapshot":
            channel.capabilities.resolve_mode(str(params.get("mode", "")))

    async def snapshot(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        return await self._command(job, "snapshot", params)

    async def restore(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        return await self._command(job, "restore", params)

    async def _command(self, job: JobRef, kind: str, params: Mapping[str, Any]) -> Moved:
        result = await self._channels.send(
            job.group,
            job.job,
            kind,
            str(params.get("mode", "")),
            tuple(params.get("tags", ())),
            float(params.get("timeout", DEFAULT_TIMEOUT)),
        )
        return Moved(result.storage_bytes, result.device_bytes)

    async def state(self, job: JobRef) -> str | None:
        # Known while the workload's channel is open; a workload that reconnects
        # says where it is when it registers again.
        channel = self._channels.get(job.group, job.job)
        return channel.state if channel is not None else None

    async def accelerators(self) -> list[AcceleratorMemory]:
        return []

    async def close(self) -> None:
        pass
