"""`cuda`: the CUDA driver's process checkpoint API, called in the agent's own
process through cuda-python.

A job is a set of processes (`{"pids": [...]}`), or a Kubernetes pod's
(`{"pod_uid": ...}`): then its processes are, at each operation, those of the
pod's cgroups (`_cgroups.pod_pids`) that the driver knows as CUDA processes (the
pod's pause process and shells are not). A snapshot locks every one of
them, then checkpoints every one (the driver copies each process's device
memory to host memory and releases its device references); a restore restores
every one, then unlocks every one. Within a phase the processes are handled
concurrently (each on its own GPU, usually); no phase starts before the one
before it has finished for all of them. If a phase fails for any process,
what the others did is undone where it can be (a snapshot brings every process
back to RUNNING, a failed restore back to CHECKPOINTED) and the error names the
driver's result. Before acting, every process must be in the state the
operation starts from.

Every driver and NVML call runs in a worker thread of its own, with a time
limit: the operation's remaining time (`params["timeout"]`, which the agent
passes) and a limit per kind of call (the options below). A call that outlives
its limit cannot be stopped; its process is left alone, and refused by later
operations, until the call returns. The operation keeps a share of its time
for the rollback, so that a failure is undone before the agent's own deadline;
an operation cancelled half way is undone in the background once its calls
have returned (`close` waits for that a while).

The agent initializes the driver (`cuInit`, which a restore needs unless
persistence mode is on) but never holds a CUDA context: no call made here
creates one.

One operation at a time per GPU: NVML tells which GPUs a job's processes hold
memory on (at snapshot time; a restore uses the set seen at the snapshot).
Where NVML cannot tell (no NVML, processes it does not list, or a restore after
the agent restarted), the operation takes every GPU of the node, or one
node-wide lock without NVML.

When errors are raised: a missing cuda-python, or bindings without the
checkpoint API, at construction, so that the agent reports the backend as not
available, with the fix, from its start. A missing or too old driver at the
first call that needs it (`check`, `snapshot`, `restore`, `state`), because a
driver may come up after the agent (it is retried until it works).
`accelerators()` never raises: without NVML it answers no accelerators.

Options (`BackendContext.options`, all in seconds): `lock_timeout_s` (how long
a lock may wait for the process's CUDA calls in flight, default 30),
`transfer_timeout_s` (one checkpoint or restore call, default 600),
`call_timeout_s` (any other call, default 30).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from timeslice.backends import AcceleratorMemory, BackendContext, JobRef, Moved
from timeslice.backends import _cuda_driver as drv
from timeslice.backends._cgroups import pod_pids
from timeslice.backends._cuda_limits import Budget, CudaTimeouts, DeviceLocks, DriverThreads
from timeslice.backends._cuda_nvml import Nvml, Usage
from timeslice.backends._processes import pid_exists
from timeslice.ids import check_pod_uid
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    TimeSliceError,
)

__all__ = ["CudaBackend", "CudaTimeouts", "parse_pids", "parse_pod"]

log = logging.getLogger(__name__)

GET_STATE: Final = "cuCheckpointProcessGetState"
LOCK: Final = "cuCheckpointProcessLock"
CHECKPOINT: Final = "cuCheckpointProcessCheckpoint"
RESTORE: Final = "cuCheckpointProcessRestore"
UNLOCK: Final = "cuCheckpointProcessUnlock"

# How much longer than its own timeoutMs a lock call may take to come back.
LOCK_GRACE_S: Final = 1.0
# The lock that stands for every device when there is no telling which.
ALL_DEVICES: Final = "*"

# How to bring a process from a state (key) back to a target state.
_UNDO: Final[dict[tuple[str, str], tuple[str, ...]]] = {
    (drv.RUNNING, drv.RUNNING): (),
    (drv.LOCKED, drv.RUNNING): (UNLOCK,),
    (drv.CHECKPOINTED, drv.RUNNING): (RESTORE, UNLOCK),
    (drv.CHECKPOINTED, drv.CHECKPOINTED): (),
    (drv.LOCKED, drv.CHECKPOINTED): (CHECKPOINT,),
}


def parse_pids(config: Mapping[str, Any]) -> tuple[int, ...]:
    """The job's process ids, checked: `{"pids": [int, ...]}`, non-empty, no repeats,
    neither init (pid 1) nor the agent. Whose processes a caller may name is the
    agent's to check (`timeslice.agent.access.check_pids`)."""
    unknown = sorted(set(config) - {"pids"})
    if unknown:
        raise InvalidArgumentError(f"the cuda backend takes only 'pids', got {unknown}")
    pids = config.get("pids")
    if not isinstance(pids, list | tuple) or not pids:
        raise InvalidArgumentError("the cuda backend needs 'pids': a non-empty list of process ids")
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise InvalidArgumentError(f"the cuda backend: {pid!r} is not a process id")
    if len(set(pids)) != len(pids):
        raise InvalidArgumentError(f"the cuda backend: process ids repeat in {list(pids)}")
    if 1 in pids:
        raise PermissionDeniedError("the cuda backend: pid 1 is the node's init process, no job's")
    if os.getpid() in pids:
        raise InvalidArgumentError(
            f"the cuda backend cannot checkpoint the agent (pid {os.getpid()})"
        )
    return tuple(pids)


def parse_pod(config: Mapping[str, Any]) -> str | None:
    """The pod a job's config names (`{"pod_uid": ...}`, checked), or None when it
    names pids instead."""
    if "pod_uid" not in config:
        return None
    unknown = sorted(set(config) - {"pod_uid"})
    if unknown:
        raise InvalidArgumentError(f"the cuda backend takes 'pod_uid' alone, got also {unknown}")
    return check_pod_uid(config["pod_uid"])


class CudaBackend:
    """Checkpoints a job's processes with the CUDA driver's process checkpoint API.

    `driver` is cuda-python's driver module (`cuda.bindings.driver`) or a
    stand-in; `nvml` is pynvml or a stand-in. Both are found when not given."""

    name = "cuda"

    def __init__(
        self,
        context: BackendContext,
        driver: Any = None,
        nvml: Any = None,
        *,
        timeouts: CudaTimeouts | None = None,
    ) -> None:
        self._timeouts = timeouts or CudaTimeouts.from_options(context.options)
        self._cgroup_root = context.cgroup_root
        self._driver = driver if driver is not None else drv.import_driver()
        drv.check_bindings(self._driver)
        self._nvml = Nvml(nvml)
        self._driver_version: int | None = None
        self._init_lock = asyncio.Lock()
        self._locks = DeviceLocks()
        self._devices: dict[tuple[str, str], frozenset[str]] = {}
        self._threads = DriverThreads()
        self._repairs: set[asyncio.Task[None]] = set()

    # --- the Backend protocol ---------------------------------------------------------

    async def check(self, job: JobRef) -> tuple[str, ...]:
        """Refuse a job whose processes do not exist or are unknown to the driver."""
        if (pod := parse_pod(job.config)) is not None:
            await self._pids(job)  # the pod has CUDA processes here now
            return (f"pod:{pod}",)
        pids = parse_pids(job.config)
        await self._ready()
        results = await asyncio.gather(
            *(self._query(pid, self._timeouts.call_timeout_s) for pid in pids)
        )
        for pid, result in zip(pids, results, strict=True):
            if not drv.succeeded(result):
                raise NotFoundError(
                    f"pid {pid} is not a CUDA process the driver knows "
                    f"({GET_STATE}: {drv.error_name(result)})"
                )
        return tuple(f"pid:{pid}" for pid in pids)

    async def check_operation(self, job: JobRef, kind: str, params: Mapping[str, Any]) -> None:
        """The driver's checkpoint takes no mode or tags: it moves the whole process."""
        extra = sorted(set(params) - {"timeout"})
        if extra:
            raise InvalidArgumentError(f"the cuda backend takes no operation options, got {extra}")

    async def snapshot(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        """Lock every process, then checkpoint every one."""
        pids = await self._pids(job)
        budget = Budget(params.get("timeout"))
        await self._ready()
        self._refuse_busy(pids)
        usage: Usage | None = await self._nvml_call(self._nvml.usage, pids)
        devices = usage.devices if usage is not None else await self._all_devices()
        async with self._locks.hold(devices, budget):
            await self._expect(job, "snapshot", pids, drv.RUNNING, budget)
            await self._run(
                job,
                "snapshot",
                pids,
                ((LOCK, drv.RUNNING), (CHECKPOINT, drv.RUNNING)),
                budget,
                devices,
            )
        if usage is not None:
            self._devices[(job.group, job.job)] = usage.devices
        moved = usage.bytes if usage is not None else None
        return Moved(storage_bytes=moved, device_bytes=moved)

    async def restore(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        """Restore every process, then unlock every one."""
        pids = await self._pids(job)
        budget = Budget(params.get("timeout"))
        await self._ready()
        self._refuse_busy(pids)
        devices = self._devices.get((job.group, job.job)) or await self._all_devices()
        async with self._locks.hold(devices, budget):
            await self._expect(job, "restore", pids, drv.CHECKPOINTED, budget)
            await self._run(
                job,
                "restore",
                pids,
                ((RESTORE, drv.CHECKPOINTED), (UNLOCK, drv.RUNNING)),
                budget,
                devices,
            )
        usage: Usage | None = await self._nvml_call(self._nvml.usage, pids)
        if usage is not None:
            self._devices[(job.group, job.job)] = usage.devices
        moved = usage.bytes if usage is not None else None
        return Moved(storage_bytes=moved, device_bytes=moved)

    async def state(self, job: JobRef) -> str | None:
        """SAVED if every process is CHECKPOINTED, RUNNING if every one runs, else None."""
        await self._ready()
        try:
            pids = await self._pids(job)
            results = await asyncio.gather(
                *(self._query(pid, self._timeouts.call_timeout_s) for pid in pids)
            )
        except (NotFoundError, DeadlineExceededError):
            return None
        states = {drv.state_name(r[1]) if drv.succeeded(r) else None for r in results}
        if states == {drv.CHECKPOINTED}:
            return "SAVED"
        if states == {drv.RUNNING}:
            return "RUNNING"
        return None

    async def accelerators(self) -> list[AcceleratorMemory]:
        """Every GPU's memory, from NVML; none when NVML cannot tell."""
        memory: list[AcceleratorMemory] | None = await self._nvml_call(self._nvml.memory)
        return memory or []

    async def close(self) -> None:
        """Let interrupted operations finish undoing themselves, then stop NVML."""
        if self._threads.closed:
            return
        if self._repairs:
            await asyncio.wait(self._repairs, timeout=self._timeouts.call_timeout_s)
            for task in self._repairs:
                task.cancel()
        await self._nvml_call(self._nvml.close)
        self._threads.closed = True

    async def _pids(self, job: JobRef) -> tuple[int, ...]:
        """The job's processes: those it names, or its pod's CUDA processes now."""
        pod = parse_pod(job.config)
        if pod is None:
            return parse_pids(job.config)
        await self._ready()
        found = await asyncio.to_thread(pod_pids, pod, self._cgroup_root)
        # Neither init nor the agent, were the agent's own pod (or the host's) named.
        found = tuple(pid for pid in found if pid not in (1, os.getpid()))
        results = await asyncio.gather(
            *(self._query(pid, self._timeouts.call_timeout_s) for pid in found),
            return_exceptions=True,
        )
        pids = []
        for pid, result in zip(found, results, strict=True):
            if isinstance(result, NotFoundError):
                continue  # exited meanwhile
            if isinstance(result, BaseException):
                raise result
            if drv.succeeded(result):
                pids.append(pid)
        if not pids:
            raise NotFoundError(f"pod {pod} has no CUDA process on this node")
        return tuple(pids)

    # --- phases and rollback ------------------------------------------------------------

    async def _run(
        self,
        job: JobRef,
        verb: str,
        pids: Sequence[int],
        phases: Sequence[tuple[str, str]],
        budget: Budget,
        devices: Iterable[str],
    ) -> None:
        """Run each phase (a driver function, and the state to go back to if it
        fails) on every process, one phase after the other."""
        for function, undo_to in phases:
            try:
                failed = await self._phase(function, pids, budget)
                outcome = await self._rollback(pids, undo_to) if failed else ""
            except asyncio.CancelledError:
                self._repair_later(job, verb, pids, undo_to, frozenset(devices))
                raise
            if failed:
                errors = [failed[pid] for pid in pids if pid in failed]
                text = "; ".join(error.message for error in errors)
                raise type(errors[0])(f"{verb} of job {job.group}/{job.job}: {text}; {outcome}")

    async def _phase(
        self, function: str, pids: Sequence[int], budget: Budget
    ) -> dict[int, TimeSliceError]:
        """`function` on every process at once; the failures, by pid."""
        outcomes = await asyncio.gather(
            *(self._step(function, pid, budget) for pid in pids), return_exceptions=True
        )
        failed: dict[int, TimeSliceError] = {}
        for pid, outcome in zip(pids, outcomes, strict=True):
            if isinstance(outcome, TimeSliceError):
                failed[pid] = outcome
            elif isinstance(outcome, Exception):
                failed[pid] = InternalError(f"{function}(pid {pid}): {outcome!r}")
            elif isinstance(outcome, BaseException):
                raise outcome
        return failed

    async def _step(self, function: str, pid: int, budget: Budget | None) -> None:
        """One driver call on one process, within its limit (and the budget's, if any)."""
        what = f"{function}(pid {pid})"
        left = budget.left() if budget is not None else math.inf
        args: tuple[Any, ...] = (None,)
        if function == LOCK:
            limit = min(self._timeouts.lock_timeout_s, left)
            if limit > 0:
                args = (drv.lock_args(self._driver, int(limit * 1000)),)
            wait = limit + LOCK_GRACE_S
        elif function in (CHECKPOINT, RESTORE):
            limit = wait = min(self._timeouts.transfer_timeout_s, left)
        else:
            limit = wait = min(self._timeouts.call_timeout_s, left)
        if limit <= 0:
            raise DeadlineExceededError(f"{what}: the operation ran out of time")
        result = await self._threads.call(
            what, drv.call, self._driver, function, pid, *args, timeout=wait, pid=pid
        )
        if not drv.succeeded(result):
            raise drv.driver_error(what, result)

    async def _rollback(self, pids: Sequence[int], target: str) -> str:
        """Bring every process back to `target` where it can; say what was done."""

        async def undo(pid: int) -> str:
            if self._threads.busy(pid):
                return f"pid {pid} left as is (a driver call on it has not returned)"
            try:
                result = await self._query(pid, self._timeouts.call_timeout_s)
                if not drv.succeeded(result):
                    raise drv.driver_error(f"{GET_STATE}(pid {pid})", result)
                state = drv.state_name(result[1])
                path = _UNDO.get((state, target))
                if path is None:
                    return f"pid {pid} is {state} and cannot be brought back to {target}"
                for function in path:
                    await self._step(function, pid, None)
                return f"pid {pid} {state} -> {target}" if path else ""
            except TimeSliceError as exc:
                return f"pid {pid} not rolled back ({exc.message})"

        done = [text for text in await asyncio.gather(*(undo(pid) for pid in pids)) if text]
        return "rolled back: " + (", ".join(done) if done else "nothing to undo")

    def _repair_later(
        self, job: JobRef, verb: str, pids: Sequence[int], target: str, devices: frozenset[str]
    ) -> None:
        """The operation was cancelled half way: undo it in the background, once
        the driver calls it left running have returned."""

        async def repair() -> None:
            async with self._locks.hold(devices, Budget(None)):
                await self._threads.settle(pids, self._timeouts.transfer_timeout_s)
                outcome = await self._rollback(pids, target)
            log.warning("%s of job %s/%s was interrupted; %s", verb, job.group, job.job, outcome)

        task = asyncio.get_running_loop().create_task(repair())
        self._repairs.add(task)
        task.add_done_callback(self._repairs.discard)

    # --- helpers --------------------------------------------------------------------------

    async def _ready(self) -> None:
        """Load and initialize the driver once; raise the clear error until it works."""
        if self._driver_version is not None:
            return
        async with self._init_lock:
            if self._driver_version is None:
                self._driver_version = await self._threads.call(
                    "initializing the CUDA driver",
                    drv.init_driver,
                    self._driver,
                    timeout=self._timeouts.call_timeout_s,
                )

    async def _query(self, pid: int, timeout: float) -> tuple[Any, ...]:
        """The driver's answer to GetState for `pid` (NotFoundError if it has exited)."""
        if not pid_exists(pid):
            raise NotFoundError(f"pid {pid} does not exist")
        result: tuple[Any, ...] = await self._threads.call(
            f"{GET_STATE}(pid {pid})",
            drv.call,
            self._driver,
            GET_STATE,
            pid,
            timeout=timeout,
            pid=pid,
        )
        return result

    async def _expect(
        self, job: JobRef, verb: str, pids: Sequence[int], expected: str, budget: Budget
    ) -> None:
        """Refuse to start unless every process is in state `expected`."""
        timeout = min(self._timeouts.call_timeout_s, budget.left())
        results = await asyncio.gather(*(self._query(pid, timeout) for pid in pids))
        wrong = []
        for pid, result in zip(pids, results, strict=True):
            if not drv.succeeded(result):
                raise drv.driver_error(f"{GET_STATE}(pid {pid})", result)
            if (state := drv.state_name(result[1])) != expected:
                wrong.append(f"pid {pid} is {state}")
        if wrong:
            raise ConflictError(
                f"cannot {verb} job {job.group}/{job.job}: {', '.join(wrong)}, not {expected}"
            )

    async def _all_devices(self) -> frozenset[str]:
        ids: list[str] | None = await self._nvml_call(self._nvml.device_ids)
        return frozenset(ids) if ids else frozenset({ALL_DEVICES})

    async def _nvml_call(self, function: Callable[..., Any], *args: Any) -> Any:
        """An NVML read; None when it fails or takes too long (NVML only informs)."""
        try:
            return await self._threads.call(
                "NVML", function, *args, timeout=self._timeouts.call_timeout_s
            )
        except TimeSliceError:
            return None

    def _refuse_busy(self, pids: Iterable[int]) -> None:
        busy = [pid for pid in pids if self._threads.busy(pid)]
        if busy:
            raise ConflictError(
                f"pids {busy} still have a driver call from an earlier operation running"
            )
