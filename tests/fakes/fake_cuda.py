"""A fake CUDA driver and a fake NVML, for testing the `cuda` backend without a GPU.

`FakeCuda` models what the driver knows of each process: its checkpoint state
machine, as the CUDA driver API documents it,

    RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING

and the device memory it holds (none while CHECKPOINTED). Its calls answer as
cuda-python's do: `(CUresult, value...)` tuples, never exceptions, except that
every call raises a `RuntimeError` when the driver library is "missing". Before
`cuInit` every call but `cuInit` and `cuDriverGetVersion` answers
CUDA_ERROR_NOT_INITIALIZED; an unknown pid gets CUDA_ERROR_NOT_FOUND (the driver's
documentation names no code for that case, so the backend must not rely on
one); a call illegal in the process's state gets CUDA_ERROR_ILLEGAL_STATE and
changes nothing.

A test can make a call fail (`fail`), hang until released (`hang`, `release`),
or make a process busy so that a lock waits out its `timeoutMs` and answers
CUDA_ERROR_TIMEOUT (`busy`). Every call is recorded in `calls`.

`FakeCuda.module()` is what the backend takes as its driver module, with
symbols left out on demand; `FakeNvml(cuda).module()` is its pynvml.
"""

from __future__ import annotations

import enum
import threading
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class CUresult(enum.IntEnum):
    """The results the fake gives, with the driver's numbers."""

    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_OPERATING_SYSTEM = 304
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_NOT_PERMITTED = 800
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_TIMEOUT = 909
    CUDA_ERROR_UNKNOWN = 999


class CUprocessState(enum.IntEnum):
    CU_PROCESS_STATE_RUNNING = 0
    CU_PROCESS_STATE_LOCKED = 1
    CU_PROCESS_STATE_CHECKPOINTED = 2
    CU_PROCESS_STATE_FAILED = 3
    CU_PROCESS_STATE_CHECKPOINTING = 4
    CU_PROCESS_STATE_RESTORING = 5


RUNNING = CUprocessState.CU_PROCESS_STATE_RUNNING
LOCKED = CUprocessState.CU_PROCESS_STATE_LOCKED
CHECKPOINTED = CUprocessState.CU_PROCESS_STATE_CHECKPOINTED
FAILED = CUprocessState.CU_PROCESS_STATE_FAILED


class CUcheckpointLockArgs:
    def __init__(self) -> None:
        self.timeoutMs = 0


class CUcheckpointCheckpointArgs:
    pass


class CUcheckpointRestoreArgs:
    pass


class CUcheckpointUnlockArgs:
    pass


class DriverLibraryMissing(RuntimeError):
    """What cuda-python raises when it cannot load libcuda."""


# Each checkpoint call: the state it needs, and the state it leaves.
TRANSITIONS = {
    "cuCheckpointProcessLock": (RUNNING, LOCKED),
    "cuCheckpointProcessCheckpoint": (LOCKED, CHECKPOINTED),
    "cuCheckpointProcessRestore": (CHECKPOINTED, LOCKED),
    "cuCheckpointProcessUnlock": (LOCKED, RUNNING),
}

# Calls that would give the caller a CUDA context; the backend must never make them.
CONTEXT_CALLS = ("cuCtxCreate", "cuDevicePrimaryCtxRetain", "cuMemAlloc")


@dataclass
class FakeProcess:
    pid: int
    device: int = 0
    device_bytes: int = 1 << 30
    state: CUprocessState = RUNNING


@dataclass
class _Fault:
    error: CUresult
    times: int | None  # None: every time
    state_after: CUprocessState | None


@dataclass
class FakeCuda:
    """The driver's view of processes, and a driver module that acts on it."""

    version: int = 12080
    library: bool = True  # False: libcuda is missing and every call raises
    init_result: CUresult = CUresult.CUDA_SUCCESS
    binding_version: str = "fake"
    processes: dict[int, FakeProcess] = field(default_factory=dict)
    calls: list[tuple[str, int | None]] = field(default_factory=list)
    lock_timeouts: dict[int, int] = field(default_factory=dict)
    initialized: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: dict[tuple[str, int | None], _Fault] = {}
        self._hangs: dict[tuple[str, int | None], threading.Event] = {}
        self._busy: dict[int, threading.Event] = {}
        self._released = threading.Event()

    # --- what a test sets up ----------------------------------------------------------

    def add_process(self, pid: int, device: int = 0, device_bytes: int = 1 << 30) -> FakeProcess:
        process = FakeProcess(pid, device, device_bytes)
        self.processes[pid] = process
        return process

    def fail(
        self,
        call: str,
        pid: int | None = None,
        error: CUresult = CUresult.CUDA_ERROR_UNKNOWN,
        times: int | None = 1,
        state_after: CUprocessState | None = None,
    ) -> None:
        """Make `call` (on `pid`, or any) answer `error`, leaving the process in
        `state_after` (unchanged if None)."""
        self._faults[(call, pid)] = _Fault(error, times, state_after)

    def hang(self, call: str, pid: int | None = None) -> None:
        """Make `call` (on `pid`, or any) block until `release()`, then go on normally."""
        self._hangs[(call, pid)] = self._released

    def busy(self, pid: int) -> None:
        """The process has CUDA work in flight that does not finish: a lock waits out
        its timeoutMs, then answers CUDA_ERROR_TIMEOUT and leaves it RUNNING."""
        self._busy[pid] = self._released

    def release(self) -> None:
        """Let every hung call and busy process go on."""
        self._released.set()

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def state_of(self, pid: int) -> CUprocessState:
        return self.processes[pid].state

    def module(self, missing: Iterable[str] = ()) -> types.ModuleType:
        """A driver module as cuda-python's, without the symbols named in `missing`."""
        module = types.ModuleType("fake_cuda_driver")
        symbols: dict[str, Any] = {
            "__version__": self.binding_version,
            "CUresult": CUresult,
            "CUprocessState": CUprocessState,
            "CUcheckpointLockArgs": CUcheckpointLockArgs,
            "CUcheckpointCheckpointArgs": CUcheckpointCheckpointArgs,
            "CUcheckpointRestoreArgs": CUcheckpointRestoreArgs,
            "CUcheckpointUnlockArgs": CUcheckpointUnlockArgs,
            "cuInit": self.cuInit,
            "cuDriverGetVersion": self.cuDriverGetVersion,
            "cuGetErrorName": self.cuGetErrorName,
            "cuCheckpointProcessGetState": self.cuCheckpointProcessGetState,
            "cuCheckpointProcessLock": self.cuCheckpointProcessLock,
            "cuCheckpointProcessCheckpoint": self.cuCheckpointProcessCheckpoint,
            "cuCheckpointProcessRestore": self.cuCheckpointProcessRestore,
            "cuCheckpointProcessUnlock": self.cuCheckpointProcessUnlock,
        }
        for name in CONTEXT_CALLS:
            symbols[name] = self._context_call(name)
        for name, value in symbols.items():
            if name not in set(missing):
                setattr(module, name, value)
        return module

    # --- the driver's calls -------------------------------------------------------------

    def cuInit(self, flags: int) -> tuple[CUresult]:
        self._enter("cuInit", None)
        if flags != 0:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if self.init_result == CUresult.CUDA_SUCCESS:
            self.initialized = True
        return (self.init_result,)

    def cuDriverGetVersion(self) -> tuple[CUresult, int]:
        self._enter("cuDriverGetVersion", None)
        return (CUresult.CUDA_SUCCESS, self.version)

    def cuGetErrorName(self, error: CUresult) -> tuple[CUresult, bytes]:
        self._enter("cuGetErrorName", None)
        return (CUresult.CUDA_SUCCESS, CUresult(error).name.encode())

    def cuCheckpointProcessGetState(self, pid: int) -> tuple[CUresult, CUprocessState | None]:
        error = self._precheck("cuCheckpointProcessGetState", pid)
        if error is not None:
            return (error, None)
        return (CUresult.CUDA_SUCCESS, self.processes[pid].state)

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> tuple[CUresult]:
        if args is not None and pid in self.processes:
            self.lock_timeouts[pid] = args.timeoutMs
        error = self._precheck("cuCheckpointProcessLock", pid)
        if error is None and pid in self._busy:
            timeout_ms = args.timeoutMs if args is not None else 0
            released = self._busy[pid].wait(timeout_ms / 1000 if timeout_ms else None)
            if not released:
                return (CUresult.CUDA_ERROR_TIMEOUT,)
        return self._transition("cuCheckpointProcessLock", pid, error)

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> tuple[CUresult]:
        error = self._precheck("cuCheckpointProcessCheckpoint", pid)
        return self._transition("cuCheckpointProcessCheckpoint", pid, error)

    def cuCheckpointProcessRestore(self, pid: int, args: Any) -> tuple[CUresult]:
        error = self._precheck("cuCheckpointProcessRestore", pid)
        return self._transition("cuCheckpointProcessRestore", pid, error)

    def cuCheckpointProcessUnlock(self, pid: int, args: Any) -> tuple[CUresult]:
        error = self._precheck("cuCheckpointProcessUnlock", pid)
        return self._transition("cuCheckpointProcessUnlock", pid, error)

    # --- inside ----------------------------------------------------------------------

    def _enter(self, call: str, pid: int | None) -> None:
        with self._lock:
            self.calls.append((call, pid))
        if not self.library:
            raise DriverLibraryMissing(
                '"cuda" is an NVIDIA driver library and can only be found via system search'
            )
        hang = self._hangs.get((call, pid)) or self._hangs.get((call, None))
        if hang is not None:
            hang.wait()

    def _precheck(self, call: str, pid: int) -> CUresult | None:
        """Record the call; the error it answers before looking at the state, if any."""
        self._enter(call, pid)
        if not self.initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED
        if pid not in self.processes:
            return CUresult.CUDA_ERROR_NOT_FOUND
        with self._lock:
            fault = self._faults.get((call, pid)) or self._faults.get((call, None))
            if fault is None:
                return None
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    key = (call, pid) if (call, pid) in self._faults else (call, None)
                    del self._faults[key]
            if fault.state_after is not None:
                self.processes[pid].state = fault.state_after
            return fault.error

    def _transition(self, call: str, pid: int, error: CUresult | None) -> tuple[CUresult]:
        if error is not None:
            return (error,)
        before, after = TRANSITIONS[call]
        with self._lock:
            process = self.processes[pid]
            if process.state != before:
                return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
            process.state = after
        return (CUresult.CUDA_SUCCESS,)

    def _context_call(self, name: str) -> Any:
        def call(*args: Any) -> tuple[CUresult, None]:
            self._enter(name, None)
            return (CUresult.CUDA_ERROR_NOT_PERMITTED, None)

        return call


# --- NVML ---------------------------------------------------------------------------------


class NVMLError(Exception):
    """pynvml's base error."""


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 (pynvml's name)
    pass


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _ProcessInfo:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 (pynvml's name)


@dataclass
class FakeNvml:
    """NVML over a `FakeCuda`: its devices' memory, and the processes holding some
    (those not CHECKPOINTED), with what each holds."""

    cuda: FakeCuda
    devices: int = 2
    total_bytes: int = 80 << 30
    base_used_bytes: int = 512 << 20
    available: bool = True
    memory_known: bool = True  # False: usedGpuMemory is None, as where the driver cannot tell
    initialized: bool = False
    shut_down: bool = False

    def uuid(self, index: int) -> str:
        return f"GPU-fake-{index:04d}"

    def module(self) -> types.ModuleType:
        module = types.ModuleType("fake_pynvml")
        module.NVMLError = NVMLError  # type: ignore[attr-defined]
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetComputeRunningProcesses",
        ):
            setattr(module, name, getattr(self, name))
        return module

    def nvmlInit(self) -> None:
        if not self.available:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized = False
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check()
        if not 0 <= index < self.devices:
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._check()
        return self.uuid(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        self._check()
        used = self.base_used_bytes + sum(p.device_bytes for p in self._holding(handle))
        return _Memory(self.total_bytes, used, self.total_bytes - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_ProcessInfo]:
        self._check()
        return [
            _ProcessInfo(p.pid, p.device_bytes if self.memory_known else None)
            for p in self._holding(handle)
        ]

    def _holding(self, device: int) -> list[FakeProcess]:
        return [
            p
            for p in self.cuda.processes.values()
            if p.device == device and p.state in (RUNNING, LOCKED)
        ]

    def _check(self) -> None:
        if not self.initialized:
            raise NVMLError("Uninitialized")
