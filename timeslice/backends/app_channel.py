"""`app_channel`: the workload does its own offload, told over its workload channel.

The agent sends the registered workload a snapshot or restore command and waits
for its answer; the bytes moved are what the workload measured and reported
(None if it reported nothing). The suspend mode is resolved from what the
workload registered: unspecified means its default, else offload.

A workload that registered `pipelined` is moved tag by tag in a switch: its
snapshot is one command per tag (then one without tags, for whatever carries
none), each step's freed memory told to the switch's `Pace` as it ends; its
restore goes in the same steps, each once the memory that step freed fits in
what the others have freed meanwhile (see `timeslice.agent.pipeline`). One
whose last snapshot took less than `STEPPED_SNAPSHOT_S` is moved whole: its
round trips would cost more than the overlap saves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from timeslice.agent.channels import Result, WorkloadChannel
from timeslice.agent.pipeline import Pace
from timeslice.backends import AcceleratorMemory, BackendContext, JobRef, Moved
from timeslice.errors import InvalidArgumentError

# How long a command may take when the operation gives no deadline of its own.
DEFAULT_TIMEOUT = 300.0
# A pipelined workload whose last snapshot took less than this is moved whole: a
# command per tag would cost more round trips than the overlap could save.
STEPPED_SNAPSHOT_S = 0.05


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
        self._channels.channel(job.group, job.job)  # ConflictError if none is open
        return ()

    async def check_operation(self, job: JobRef, kind: str, params: Mapping[str, Any]) -> None:
        channel = self._channels.channel(job.group, job.job)
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
            _timeout(params),
        )
        return Moved(result.storage_bytes, result.device_bytes)

    # --- pipelined switches ---------------------------------------------------------------

    def pipelines(self, job: JobRef) -> bool:
        channel = self._channels.get(job.group, job.job)
        return channel is not None and channel.steps is not None

    async def snapshot_paced(self, job: JobRef, params: Mapping[str, Any], pace: Pace) -> Moved:
        channel = self._channels.channel(job.group, job.job)
        started = time.monotonic()
        last = channel.snapshot_seconds
        if not channel.capabilities.pipelined or (last is not None and last < STEPPED_SNAPSHOT_S):
            moved = await self._command(job, "snapshot", params)
            pace.freed(moved.device_bytes)
        else:
            moved = await self._snapshot_steps(channel, params, pace, started + _timeout(params))
        channel.snapshot_seconds = time.monotonic() - started
        return moved

    async def _snapshot_steps(
        self, channel: WorkloadChannel, params: Mapping[str, Any], pace: Pace, deadline: float
    ) -> Moved:
        """Snapshot tag by tag, telling `pace` what each step freed; keep the steps."""
        asked = tuple(params.get("tags", ()))
        # Each tag asked (none: each tag it has, then whatever carries none) in turn.
        plan: list[tuple[str, ...]] = [(tag,) for tag in asked or channel.capabilities.tags]
        if not asked:
            plan.append(())
        mode = str(params.get("mode", ""))
        steps: list[tuple[tuple[str, ...], int | None]] = []
        results: list[Result] = []
        channel.steps = None
        try:
            for tags in plan:
                result = await self._channels.step(
                    channel, "snapshot", mode, tags, deadline - time.monotonic()
                )
                results.append(result)
                # Every step, even one that says it moved nothing: the restore replays
                # them all, so that nothing a workload moved unsaid stays out.
                steps.append((tags, result.device_bytes))
                pace.freed(result.device_bytes)
        except BaseException:
            if results:  # partly out: where it is, only the workload can say now
                channel.state = ""
            raise
        channel.state, channel.steps = "SAVED", steps
        return _total(results)

    async def restore_paced(self, job: JobRef, params: Mapping[str, Any], pace: Pace) -> Moved:
        channel = self._channels.channel(job.group, job.job)
        steps = channel.steps
        asked = tuple(params.get("tags", ()))
        if steps is None or (asked and asked != tuple(t for tags, _ in steps for t in tags)):
            # Its steps not known (or other tags asked): all at once, when nothing is left
            # to wait for.
            await pace.enter(None)
            return await self._command(job, "restore", params)
        deadline = time.monotonic() + _timeout(params)
        results: list[Result] = []
        try:
            for tags, nbytes in steps:
                # A step that said it freed nothing may have moved something unsaid:
                # as a size not known, it waits for every snapshot to end.
                await pace.enter(nbytes or None)
                results.append(
                    await self._channels.step(
                        channel, "restore", "", tags, deadline - time.monotonic()
                    )
                )
        except BaseException:
            if results:
                channel.state = ""
            raise
        channel.state, channel.steps = "RUNNING", None
        return _total(results)

    async def state(self, job: JobRef) -> str | None:
        # Known while the workload's channel is open; a workload that reconnects
        # says where it is when it registers again.
        channel = self._channels.get(job.group, job.job)
        return channel.state if channel is not None else None

    async def accelerators(self) -> list[AcceleratorMemory]:
        return []

    async def close(self) -> None:
        pass


def _timeout(params: Mapping[str, Any]) -> float:
    return float(params.get("timeout", DEFAULT_TIMEOUT))


def _total(results: Sequence[Result]) -> Moved:
    """What the steps moved together (None where any step did not say)."""

    def total(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else sum(v or 0 for v in values)

    return Moved(
        total([r.storage_bytes for r in results]), total([r.device_bytes for r in results])
    )
