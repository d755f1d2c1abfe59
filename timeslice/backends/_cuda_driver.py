"""The CUDA driver as the `cuda` backend sees it: finding cuda-python's driver
module, checking that it and the driver can checkpoint processes, and naming
what the driver answers.

Everything here is synchronous; the backend runs the calls that reach the
driver in worker threads. cuda-python calls return `(CUresult, value...)`
tuples rather than raising, except when the driver library itself is missing,
when they raise a `RuntimeError` subclass.

Facts relied on (CUDA driver API, "CUDA Checkpointing"; cuda-python's
`cuda.bindings.driver`):

- The process checkpoint API (`cuCheckpointProcess{GetState,Lock,Checkpoint,
  Restore,Unlock}`) first shipped with CUDA 12.8: `cuDriverGetVersion` must
  report at least 12080 (an R570 driver or newer).
- cuda-bindings 12.8+ and 13.0.2+ expose it; 13.0.0 and 13.0.1 do not, and
  13.3.0 lacks `CUcheckpointRestoreArgs`.
- Restoring needs persistence mode or `cuInit` in the calling process; `cuInit`
  creates no context, and neither do the checkpoint calls without custom
  storage (which this backend never asks for).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any, Final

from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InternalError,
    NotFoundError,
    TimeSliceError,
    UnavailableError,
)

# cuDriverGetVersion's encoding: 1000 * major + 10 * minor.
MIN_DRIVER_VERSION: Final = 12080

INSTALL_HINT: Final = "pip install 'timeslice[cuda]'"

# Binding releases known to lack part of the checkpoint API.
BAD_BINDING_RELEASES: Final = ("13.0.0", "13.0.1", "13.3.0")

# What this backend calls or builds; checked before the first call.
REQUIRED_SYMBOLS: Final = (
    "CUresult",
    "CUprocessState",
    "CUcheckpointLockArgs",
    "CUcheckpointRestoreArgs",
    "cuInit",
    "cuDriverGetVersion",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
)

# The process states, as CUprocessState names them without their prefix.
RUNNING: Final = "RUNNING"
LOCKED: Final = "LOCKED"
CHECKPOINTED: Final = "CHECKPOINTED"
FAILED: Final = "FAILED"
_STATE_PREFIX: Final = "CU_PROCESS_STATE_"

# Results that mean the driver gave up waiting (a lock whose timeoutMs ran out).
_TIMEOUT_ERRORS: Final = frozenset({"CUDA_ERROR_TIMEOUT", "CUDA_ERROR_NOT_READY"})
# Results that mean the call is illegal in the process's current state.
_STATE_ERRORS: Final = frozenset({"CUDA_ERROR_ILLEGAL_STATE"})
# Results that mean this node cannot do it at all.
_NODE_ERRORS: Final = frozenset(
    {"CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_NOT_SUPPORTED"}
)


def import_driver() -> Any:
    """cuda-python's driver module, or a clear error with the install hint."""
    for name in ("cuda.bindings.driver", "cuda.cuda"):  # the second: releases before 12.6
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ConflictError(f"the cuda backend needs cuda-python: {INSTALL_HINT}")


def binding_version(driver: Any) -> str | None:
    """The release of the bindings that `driver` comes from, if it can tell."""
    name = getattr(driver, "__name__", "")
    if not name.startswith("cuda."):
        return getattr(driver, "__version__", None)
    for dist in ("cuda-bindings", "cuda-python"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_bindings(driver: Any) -> None:
    """Refuse a driver module that lacks part of the checkpoint API."""
    missing = [symbol for symbol in REQUIRED_SYMBOLS if not hasattr(driver, symbol)]
    if not missing:
        return
    version = binding_version(driver)
    release = f"cuda-bindings {version}" if version else "the installed cuda-python"
    raise ConflictError(
        f"{release} lacks the CUDA process checkpoint API ({', '.join(missing)}); releases "
        f"before 12.8 and {', '.join(BAD_BINDING_RELEASES)} are known to: install another "
        f"(pip install 'cuda-bindings>=12.8,!={',!='.join(BAD_BINDING_RELEASES)}')"
    )


def init_driver(driver: Any) -> int:
    """Load and initialize the driver; return its version. Raises a clear error when
    there is no driver, or one too old to checkpoint processes."""
    try:
        result = driver.cuDriverGetVersion()
    except RuntimeError as exc:  # libcuda could not be loaded
        raise UnavailableError(f"no CUDA driver on this node ({exc})") from exc
    if not succeeded(result):
        raise UnavailableError(f"no usable CUDA driver: cuDriverGetVersion: {error_name(result)}")
    version = int(result[1])
    if version < MIN_DRIVER_VERSION:
        raise ConflictError(
            f"the CUDA driver supports CUDA {format_version(version)}; checkpointing processes "
            f"needs {format_version(MIN_DRIVER_VERSION)} or newer (an R570 driver or later)"
        )
    try:
        result = driver.cuInit(0)
    except RuntimeError as exc:
        raise UnavailableError(f"no CUDA driver on this node ({exc})") from exc
    if not succeeded(result):
        raise UnavailableError(f"the CUDA driver did not initialize: cuInit: {error_name(result)}")
    return version


def format_version(version: int) -> str:
    """12080 -> "12.8"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def as_tuple(result: Any) -> tuple[Any, ...]:
    """A driver call's result as a tuple (a bare CUresult becomes a 1-tuple)."""
    return result if isinstance(result, tuple) else (result,)


def succeeded(result: Any) -> bool:
    return int(as_tuple(result)[0]) == 0


def error_name(result: Any) -> str:
    """The CUresult's name, as cuGetErrorName gives it, without asking the driver."""
    code = as_tuple(result)[0]
    name = getattr(code, "name", None)
    return name if isinstance(name, str) else f"CUresult {int(code)}"


def state_name(state: Any) -> str:
    """A CUprocessState as "RUNNING", "LOCKED", ... (or its number if unknown)."""
    name = getattr(state, "name", None)
    if isinstance(name, str):
        return name.removeprefix(_STATE_PREFIX)
    return f"state {int(state)}"


def lock_args(driver: Any, timeout_ms: int) -> Any:
    """CUcheckpointLockArgs that give up after `timeout_ms` (0 would mean never)."""
    args = driver.CUcheckpointLockArgs()
    args.timeoutMs = max(1, min(timeout_ms, 2**32 - 1))
    return args


def call(driver: Any, function: str, *args: Any) -> tuple[Any, ...]:
    """Call a driver function; a driver library that is missing becomes a clear error."""
    try:
        return as_tuple(getattr(driver, function)(*args))
    except RuntimeError as exc:
        raise UnavailableError(f"{function}: the CUDA driver failed: {exc}") from exc


def driver_error(what: str, result: Any) -> TimeSliceError:
    """The exception for a failed call, described by `what` ("cuCheckpointProcessLock(pid 7)")."""
    name = error_name(result)
    message = f"{what} failed: {name}"
    if name in _TIMEOUT_ERRORS:
        return DeadlineExceededError(message)
    if name in _STATE_ERRORS:
        return ConflictError(message)
    if name in _NODE_ERRORS:
        return UnavailableError(message)
    if name == "CUDA_ERROR_NOT_FOUND":
        return NotFoundError(message)
    return InternalError(message)
