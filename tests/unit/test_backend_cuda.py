"""The `cuda` backend against a fake driver and a fake NVML (tests/fakes/fake_cuda.py),
and its clear errors with the real cuda-python on a machine without a GPU.

The job's pids are real processes (`sleep`), since the backend asks the OS
whether they exist before it asks the driver.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from tests.backends.conformance import BackendConformance
from tests.fakes.fake_cuda import (
    CHECKPOINTED,
    CONTEXT_CALLS,
    FAILED,
    LOCKED,
    RUNNING,
    CUresult,
    FakeCuda,
    FakeNvml,
)
from timeslice.agent.channels import WorkloadChannels
from timeslice.backends import BackendContext, JobRef, load_backend
from timeslice.backends.cuda import CudaBackend, CudaTimeouts
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)

pytestmark = pytest.mark.timeout(10)

LOCK = "cuCheckpointProcessLock"
CHECKPOINT = "cuCheckpointProcessCheckpoint"
RESTORE = "cuCheckpointProcessRestore"
UNLOCK = "cuCheckpointProcessUnlock"
GET_STATE = "cuCheckpointProcessGetState"
GIB = 1 << 30

FAST = CudaTimeouts(lock_timeout_s=0.2, transfer_timeout_s=0.3, call_timeout_s=0.3)


def context(**options: str) -> BackendContext:
    return BackendContext("node-1", WorkloadChannels(), options)


@pytest.fixture
def spawn() -> Iterator[Callable[[], int]]:
    """Start a process that only sleeps; return its pid. All are killed after the test."""
    children: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        child = subprocess.Popen(["sleep", "30"])
        children.append(child)
        return child.pid

    yield start
    for child in children:
        child.kill()
        child.wait()


@pytest.fixture
def cuda() -> Iterator[FakeCuda]:
    fake = FakeCuda()
    yield fake
    fake.release()  # no hung call outlives its test


@pytest.fixture
def nvml(cuda: FakeCuda) -> FakeNvml:
    return FakeNvml(cuda)


@pytest.fixture
async def backend(cuda: FakeCuda, nvml: FakeNvml) -> AsyncIterator[CudaBackend]:
    backend = CudaBackend(context(), cuda.module(), nvml.module(), timeouts=FAST)
    yield backend
    cuda.release()
    await backend.close()


def make_job(cuda: FakeCuda, spawn: Callable[[], int], n: int, devices: int = 2) -> JobRef:
    """A job of `n` CUDA processes, spread over `devices` GPUs, holding 1, 2, 3... GiB."""
    pids = [spawn() for _ in range(n)]
    for i, pid in enumerate(pids):
        cuda.add_process(pid, device=i % devices, device_bytes=(i + 1) * GIB)
    return JobRef("g", "j", {"pids": pids})


def pids_of(job: JobRef) -> list[int]:
    return list(job.config["pids"])


def phase_order(cuda: FakeCuda, first: str, then: str) -> None:
    """Every `first` call came before any `then` call."""
    names = [name for name in cuda.names() if name in (first, then)]
    assert names and names == sorted(names, key=lambda name: name != first), names


async def wait_for_call(cuda: FakeCuda, call: tuple[str, int]) -> None:
    while call not in cuda.calls:
        await asyncio.sleep(0.005)


# --- the fake itself ---------------------------------------------------------------------


def test_the_fake_driver_follows_the_checkpoint_state_machine() -> None:
    fake = FakeCuda()
    fake.add_process(11)
    driver = fake.module()
    assert driver.cuCheckpointProcessGetState(11) == (CUresult.CUDA_ERROR_NOT_INITIALIZED, None)
    assert driver.cuInit(0) == (CUresult.CUDA_SUCCESS,)
    assert driver.cuCheckpointProcessGetState(99)[0] == CUresult.CUDA_ERROR_NOT_FOUND
    illegal = (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
    ok = (CUresult.CUDA_SUCCESS,)
    assert driver.cuCheckpointProcessCheckpoint(11, None) == illegal  # not locked
    assert driver.cuCheckpointProcessLock(11, driver.CUcheckpointLockArgs()) == ok
    assert driver.cuCheckpointProcessLock(11, None) == illegal
    assert driver.cuCheckpointProcessCheckpoint(11, None) == ok
    assert driver.cuCheckpointProcessGetState(11) == (CUresult.CUDA_SUCCESS, CHECKPOINTED)
    assert driver.cuCheckpointProcessUnlock(11, None) == illegal  # restore first
    assert driver.cuCheckpointProcessRestore(11, None) == ok
    assert fake.state_of(11) == LOCKED
    assert driver.cuCheckpointProcessUnlock(11, None) == ok
    assert fake.state_of(11) == RUNNING


def test_the_fake_driver_fails_on_demand_and_without_its_library() -> None:
    fake = FakeCuda()
    fake.add_process(11)
    driver = fake.module()
    driver.cuInit(0)
    fake.fail(LOCK, 11, CUresult.CUDA_ERROR_NOT_SUPPORTED)
    assert driver.cuCheckpointProcessLock(11, None) == (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
    assert driver.cuCheckpointProcessLock(11, None) == (CUresult.CUDA_SUCCESS,)  # once only
    fake.library = False
    with pytest.raises(RuntimeError):
        driver.cuDriverGetVersion()
    assert not hasattr(fake.module(missing=[LOCK]), LOCK)


# --- check ---------------------------------------------------------------------------------


async def test_check_claims_every_process(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 3)
    assert await backend.check(job) == tuple(f"pid:{pid}" for pid in pids_of(job))


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({}, "needs 'pids'"),
        ({"pids": []}, "needs 'pids'"),
        ({"pids": "12"}, "needs 'pids'"),
        ({"pids": [1, "2"]}, "'2' is not a process id"),
        ({"pids": [True]}, "True is not a process id"),
        ({"pids": [-4]}, "-4 is not a process id"),
        ({"pids": [7, 7]}, "repeat"),
        ({"pids": [7], "explicit_target": {}}, "takes only 'pids'"),
    ],
)
async def test_check_refuses_a_bad_config(
    backend: CudaBackend, config: dict[str, object], words: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        await backend.check(JobRef("g", "j", config))


async def test_check_refuses_the_agent_itself(backend: CudaBackend) -> None:
    import os

    with pytest.raises(InvalidArgumentError, match="cannot checkpoint the agent"):
        await backend.check(JobRef("g", "j", {"pids": [os.getpid()]}))


async def test_check_refuses_a_process_that_does_not_exist(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    job = make_job(cuda, spawn, 1)
    with pytest.raises(NotFoundError, match=f"pid {gone.pid} does not exist"):
        await backend.check(JobRef("g", "j", {"pids": [*pids_of(job), gone.pid]}))


async def test_check_refuses_a_process_the_driver_does_not_know(
    backend: CudaBackend, spawn: Callable[[], int]
) -> None:
    pid = spawn()
    with pytest.raises(NotFoundError, match=f"pid {pid} is not a CUDA process.*NOT_FOUND"):
        await backend.check(JobRef("g", "j", {"pids": [pid]}))


# --- snapshot and restore ----------------------------------------------------------------


async def test_snapshot_locks_all_then_checkpoints_all(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 3)
    moved = await backend.snapshot(job, {})
    phase_order(cuda, LOCK, CHECKPOINT)
    assert all(cuda.state_of(pid) == CHECKPOINTED for pid in pids_of(job))
    assert moved.device_bytes == moved.storage_bytes == (1 + 2 + 3) * GIB
    # every lock gives the driver a timeout of its own (0 would mean wait forever)
    assert all(0 < cuda.lock_timeouts[pid] <= 200 for pid in pids_of(job))


async def test_restore_restores_all_then_unlocks_all(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 3)
    await backend.snapshot(job, {})
    cuda.calls.clear()
    moved = await backend.restore(job, {})
    phase_order(cuda, RESTORE, UNLOCK)
    assert all(cuda.state_of(pid) == RUNNING for pid in pids_of(job))
    assert moved.device_bytes == moved.storage_bytes == 6 * GIB


async def test_moved_bytes_follow_the_processes_memory(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 1)
    assert (await backend.snapshot(job, {})).device_bytes == GIB
    await backend.restore(job, {})
    cuda.processes[pids_of(job)[0]].device_bytes = 5 * GIB  # it allocated more
    assert (await backend.snapshot(job, {})).device_bytes == 5 * GIB


async def test_moved_is_unknown_without_nvml(cuda: FakeCuda, spawn: Callable[[], int]) -> None:
    nvml = FakeNvml(cuda, available=False)
    backend = CudaBackend(context(), cuda.module(), nvml.module(), timeouts=FAST)
    job = make_job(cuda, spawn, 2)
    assert (await backend.snapshot(job, {})).device_bytes is None
    moved = await backend.restore(job, {})
    assert moved.device_bytes is None and moved.storage_bytes is None
    assert await backend.accelerators() == []
    await backend.close()


async def test_moved_is_unknown_when_nvml_does_not_report_memory(
    cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    nvml = FakeNvml(cuda, memory_known=False)
    backend = CudaBackend(context(), cuda.module(), nvml.module(), timeouts=FAST)
    moved = await backend.snapshot(make_job(cuda, spawn, 2), {})
    assert moved.device_bytes is None and moved.storage_bytes is None
    await backend.close()


async def test_snapshot_refuses_a_job_not_running(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    cuda.processes[pids_of(job)[1]].state = LOCKED
    with pytest.raises(ConflictError, match=f"pid {pids_of(job)[1]} is LOCKED, not RUNNING"):
        await backend.snapshot(job, {})
    assert LOCK not in cuda.names()


async def test_restore_refuses_a_job_not_saved(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    with pytest.raises(ConflictError, match="is RUNNING, not CHECKPOINTED"):
        await backend.restore(job, {})
    assert RESTORE not in cuda.names()


async def test_snapshot_of_a_vanished_process_is_not_found(
    backend: CudaBackend, cuda: FakeCuda
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    cuda.add_process(gone.pid)
    with pytest.raises(NotFoundError, match="does not exist"):
        await backend.snapshot(JobRef("g", "j", {"pids": [gone.pid]}), {})


async def test_many_cycles_keep_the_driver_initialized_once_and_make_no_context(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    await backend.check(job)
    for _ in range(3):
        await backend.snapshot(job, {})
        await backend.restore(job, {})
    assert cuda.names().count("cuInit") == 1
    assert not set(cuda.names()) & set(CONTEXT_CALLS)


# --- failures half way, and their rollback --------------------------------------------------


async def test_a_failed_lock_unlocks_the_others(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 3)
    bad = pids_of(job)[1]
    cuda.fail(LOCK, bad, CUresult.CUDA_ERROR_UNKNOWN)
    with pytest.raises(InternalError) as caught:
        await backend.snapshot(job, {})
    assert f"{LOCK}(pid {bad}) failed: CUDA_ERROR_UNKNOWN" in caught.value.message
    assert "rolled back" in caught.value.message
    assert CHECKPOINT not in cuda.names()
    assert all(cuda.state_of(pid) == RUNNING for pid in pids_of(job))
    assert await backend.state(job) == "RUNNING"


async def test_a_failed_checkpoint_brings_every_process_back(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 3)
    bad = pids_of(job)[2]
    cuda.fail(CHECKPOINT, bad, CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(InternalError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        await backend.snapshot(job, {})
    assert all(cuda.state_of(pid) == RUNNING for pid in pids_of(job))
    undone = {pid for name, pid in cuda.calls if name == RESTORE}
    assert undone == set(pids_of(job)[:2])  # the checkpointed ones came back
    # and the job can be snapshotted again
    await backend.snapshot(job, {})
    assert await backend.state(job) == "SAVED"


async def test_a_failed_restore_checkpoints_the_restored_ones_again(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 3)
    await backend.snapshot(job, {})
    cuda.fail(RESTORE, pids_of(job)[0], CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(InternalError, match="OUT_OF_MEMORY.*rolled back"):
        await backend.restore(job, {})
    assert all(cuda.state_of(pid) == CHECKPOINTED for pid in pids_of(job))
    assert UNLOCK not in cuda.names()
    assert await backend.state(job) == "SAVED"
    await backend.restore(job, {})  # the fault has passed
    assert await backend.state(job) == "RUNNING"


async def test_a_failed_unlock_still_unlocks_the_others(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 3)
    stuck = pids_of(job)[1]
    await backend.snapshot(job, {})
    cuda.fail(UNLOCK, stuck, CUresult.CUDA_ERROR_ILLEGAL_STATE, times=None)
    with pytest.raises(ConflictError, match=f"pid {stuck}.*ILLEGAL_STATE.*not rolled back"):
        await backend.restore(job, {})
    others = [pid for pid in pids_of(job) if pid != stuck]
    assert all(cuda.state_of(pid) == RUNNING for pid in others)
    assert cuda.state_of(stuck) == LOCKED
    assert await backend.state(job) is None


async def test_a_failed_process_is_reported_not_forced(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    bad = pids_of(job)[0]
    cuda.fail(CHECKPOINT, bad, CUresult.CUDA_ERROR_OPERATING_SYSTEM, state_after=FAILED)
    with pytest.raises(InternalError, match=f"pid {bad} is FAILED and cannot be brought back"):
        await backend.snapshot(job, {})
    assert cuda.state_of(pids_of(job)[1]) == RUNNING
    assert await backend.state(job) is None


# --- timeouts --------------------------------------------------------------------------------


async def test_a_lock_that_waits_out_its_timeout_is_a_deadline(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    slow = pids_of(job)[1]
    cuda.busy(slow)
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError, match="CUDA_ERROR_TIMEOUT"):
        await backend.snapshot(job, {})
    assert time.monotonic() - started < 1.0
    assert cuda.lock_timeouts[slow] == 200
    assert all(cuda.state_of(pid) == RUNNING for pid in pids_of(job))


async def test_a_call_that_never_returns_is_a_deadline_and_its_process_is_left_alone(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    first, hung = pids_of(job)
    cuda.hang(CHECKPOINT, hung)
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError, match="did not return within") as caught:
        await backend.snapshot(job, {})
    assert time.monotonic() - started < 1.5
    assert f"pid {hung} left as is" in caught.value.message
    assert cuda.state_of(first) == RUNNING  # restored and unlocked
    with pytest.raises(ConflictError, match="still have a driver call"):
        await backend.snapshot(job, {})
    cuda.release()
    await backend._threads.settle([hung], 1.0)
    assert cuda.state_of(hung) == CHECKPOINTED  # the call finished after all
    assert await backend.state(job) is None


async def test_the_operation_timeout_leaves_time_to_roll_back(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    cuda.busy(pids_of(job)[0])
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await backend.snapshot(job, {"timeout": 0.1})
    assert time.monotonic() - started < 0.5  # the lock gave up at 0.075 s, then the rollback
    assert cuda.lock_timeouts[pids_of(job)[0]] <= 75  # 0.1 s less the rollback's share
    assert all(cuda.state_of(pid) == RUNNING for pid in pids_of(job))


async def test_no_time_left_means_no_call(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 1)
    await backend.check(job)
    cuda.calls.clear()
    with pytest.raises(DeadlineExceededError, match="ran out of time"):
        await backend.snapshot(job, {"timeout": -1.0})
    assert LOCK not in cuda.names()


async def test_a_cancelled_snapshot_is_undone_in_the_background(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    first, hung = pids_of(job)
    cuda.hang(CHECKPOINT, hung)
    slow = CudaTimeouts(lock_timeout_s=1, transfer_timeout_s=5, call_timeout_s=1)
    backend._timeouts = slow
    task = asyncio.create_task(backend.snapshot(job, {}))
    await wait_for_call(cuda, (CHECKPOINT, hung))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cuda.release()
    await backend.close()  # waits for the repair
    assert cuda.state_of(first) == RUNNING
    assert cuda.state_of(hung) == RUNNING


# --- one operation at a time per GPU -----------------------------------------------------------


async def test_jobs_on_one_gpu_take_turns_and_other_gpus_go_on(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    a = make_job(cuda, spawn, 1, devices=1)  # GPU 0
    b = JobRef("g", "b", {"pids": [spawn()]})
    cuda.add_process(pids_of(b)[0], device=0)
    c = JobRef("g", "c", {"pids": [spawn()]})
    cuda.add_process(pids_of(c)[0], device=1)
    cuda.hang(LOCK, pids_of(a)[0])
    slow = asyncio.create_task(backend.snapshot(a, {"timeout": 2.0}))
    await wait_for_call(cuda, (LOCK, pids_of(a)[0]))
    with pytest.raises(DeadlineExceededError, match="GPU GPU-fake-0000 stayed busy"):
        await backend.snapshot(b, {"timeout": 0.1})
    await backend.snapshot(c, {"timeout": 1.0})  # GPU 1 is free
    cuda.release()
    await slow
    await backend.snapshot(b, {"timeout": 1.0})
    assert {await backend.state(job) for job in (a, b, c)} == {"SAVED"}


async def test_a_restore_after_a_restart_takes_every_gpu(
    cuda: FakeCuda, nvml: FakeNvml, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 1, devices=1)
    for pid in pids_of(job):
        cuda.processes[pid].state = CHECKPOINTED
    backend = CudaBackend(context(), cuda.module(), nvml.module(), timeouts=FAST)
    other = JobRef("g", "other", {"pids": [spawn()]})
    cuda.add_process(pids_of(other)[0], device=1)
    cuda.hang(RESTORE)
    restoring = asyncio.create_task(backend.restore(job, {"timeout": 2.0}))
    await wait_for_call(cuda, (RESTORE, pids_of(job)[0]))
    with pytest.raises(DeadlineExceededError, match="GPU GPU-fake-0001 stayed busy"):
        await backend.snapshot(other, {"timeout": 0.1})
    cuda.release()
    await restoring
    await backend.close()


# --- state ---------------------------------------------------------------------------------


async def test_state_maps_the_driver_states(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 2)
    first, second = pids_of(job)
    assert await backend.state(job) == "RUNNING"
    await backend.snapshot(job, {})
    assert await backend.state(job) == "SAVED"
    for mixed in (LOCKED, RUNNING, FAILED):
        cuda.processes[second].state = mixed
        assert await backend.state(job) is None
    cuda.processes[second].state = CHECKPOINTED
    cuda.processes[first].state = LOCKED
    assert await backend.state(job) is None


async def test_state_of_a_vanished_or_unknown_process_is_none(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 1)
    gone = subprocess.Popen(["true"])
    gone.wait()
    cuda.add_process(gone.pid)
    assert await backend.state(JobRef("g", "j", {"pids": [*pids_of(job), gone.pid]})) is None
    assert await backend.state(JobRef("g", "j", {"pids": [spawn()]})) is None


# --- accelerators, options, close ----------------------------------------------------------------


async def test_accelerators_come_from_nvml(
    backend: CudaBackend, cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    make_job(cuda, spawn, 2)
    memory = await backend.accelerators()
    assert [m.id for m in memory] == ["GPU-fake-0000", "GPU-fake-0001"]
    assert [m.used_bytes for m in memory] == [(512 << 20) + GIB, (512 << 20) + 2 * GIB]
    assert all(m.total_bytes == 80 * GIB for m in memory)


def test_options_set_the_limits(cuda: FakeCuda) -> None:
    options = {"lock_timeout_s": "5", "transfer_timeout_s": "120", "call_timeout_s": "2.5"}
    backend = CudaBackend(context(**options), cuda.module())
    assert backend._timeouts == CudaTimeouts(5, 120, 2.5)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"lock_timeout": "5"}, "unknown options"),
        ({"call_timeout_s": "soon"}, "must be a number"),
        ({"transfer_timeout_s": "0"}, "positive"),
        ({"lock_timeout_s": "inf"}, "positive and finite"),
    ],
)
def test_bad_options_are_refused(cuda: FakeCuda, options: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        CudaBackend(context(**options), cuda.module())


async def test_close_twice_then_refuse(
    backend: CudaBackend, cuda: FakeCuda, nvml: FakeNvml, spawn: Callable[[], int]
) -> None:
    job = make_job(cuda, spawn, 1)
    await backend.accelerators()
    await backend.close()
    await backend.close()
    assert nvml.shut_down
    with pytest.raises(UnavailableError, match="closed"):
        await backend.state(job)


# --- clear errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "missing",
    [
        ("cuCheckpointProcessLock",),
        ("cuCheckpointProcessGetState", "cuCheckpointProcessCheckpoint"),
        ("CUcheckpointLockArgs",),
        ("CUprocessState",),
    ],
)
def test_bindings_without_the_checkpoint_api_are_refused_at_construction(
    cuda: FakeCuda, missing: tuple[str, ...]
) -> None:
    with pytest.raises(ConflictError) as caught:
        CudaBackend(context(), cuda.module(missing=missing))
    message = caught.value.message
    assert all(name in message for name in missing)
    assert "13.0.0, 13.0.1, 13.3.0" in message
    assert "pip install" in message
    assert cuda.calls == []  # nothing reached the driver


def test_the_bad_release_is_named(cuda: FakeCuda) -> None:
    cuda.binding_version = "13.3.0"
    with pytest.raises(
        ConflictError, match=r"cuda-bindings 13\.3\.0 lacks .*CUcheckpointRestoreArgs"
    ):
        CudaBackend(context(), cuda.module(missing=["CUcheckpointRestoreArgs"]))


async def test_a_driver_too_old_is_refused_at_first_use(
    cuda: FakeCuda, nvml: FakeNvml, spawn: Callable[[], int]
) -> None:
    cuda.version = 12040
    backend = CudaBackend(context(), cuda.module(), nvml.module(), timeouts=FAST)
    job = make_job(cuda, spawn, 1)
    with pytest.raises(ConflictError, match=r"supports CUDA 12\.4.*needs 12\.8 or newer"):
        await backend.check(job)
    with pytest.raises(ConflictError, match="12.8"):
        await backend.snapshot(job, {})
    assert "cuInit" not in cuda.names()
    assert not any(name.startswith("cuCheckpoint") for name in cuda.names())
    await backend.close()


async def test_no_driver_library_is_unavailable_until_it_comes(
    cuda: FakeCuda, nvml: FakeNvml, spawn: Callable[[], int]
) -> None:
    cuda.library = False
    nvml.available = False
    backend = CudaBackend(context(), cuda.module(), nvml.module(), timeouts=FAST)
    job = make_job(cuda, spawn, 1)
    with pytest.raises(UnavailableError, match="no CUDA driver on this node"):
        await backend.check(job)
    with pytest.raises(UnavailableError, match="no CUDA driver"):
        await backend.state(job)
    assert await backend.accelerators() == []
    cuda.library = nvml.available = True  # the driver came up after the agent
    assert await backend.check(job) == (f"pid:{pids_of(job)[0]}",)
    assert len(await backend.accelerators()) == 2
    await backend.close()


async def test_a_driver_without_devices_is_unavailable(
    cuda: FakeCuda, spawn: Callable[[], int]
) -> None:
    cuda.init_result = CUresult.CUDA_ERROR_NO_DEVICE
    backend = CudaBackend(context(), cuda.module(), FakeNvml(cuda).module(), timeouts=FAST)
    with pytest.raises(UnavailableError, match="cuInit: CUDA_ERROR_NO_DEVICE"):
        await backend.snapshot(make_job(cuda, spawn, 1), {})
    await backend.close()


def test_without_cuda_python_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.cuda"):
        monkeypatch.setitem(sys.modules, name, None)  # import of it fails
    with pytest.raises(ConflictError, match=r"needs cuda-python: pip install 'timeslice\[cuda\]'"):
        CudaBackend(context())


def test_the_registry_gives_the_cuda_backend() -> None:
    assert load_backend("cuda") is CudaBackend


async def test_the_real_bindings_without_a_driver_fail_clearly(spawn: Callable[[], int]) -> None:
    pytest.importorskip("cuda.bindings.driver", exc_type=ImportError)
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver")
    backend = CudaBackend(context())  # the bindings are complete: no error yet
    job = JobRef("g", "j", {"pids": [spawn()]})
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="no CUDA driver on this node"):
        await backend.check(job)
    with pytest.raises(UnavailableError, match="no CUDA driver on this node"):
        await backend.snapshot(job, {})
    assert await backend.accelerators() == []  # with or without pynvml
    await backend.close()
    assert time.monotonic() - started < 2.0


# --- the conformance suite ---------------------------------------------------------------------


class TestCudaConformance(BackendConformance):
    @pytest.fixture
    async def backend(self, cuda: FakeCuda, nvml: FakeNvml) -> AsyncIterator[CudaBackend]:
        backend = CudaBackend(context(), cuda.module(), nvml.module(), timeouts=FAST)
        self.cuda = cuda
        yield backend
        await backend.close()

    @pytest.fixture
    def job(self, cuda: FakeCuda, spawn: Callable[[], int]) -> JobRef:
        return make_job(cuda, spawn, 2)

    @pytest.fixture
    def bad_job(self) -> JobRef:
        return JobRef("g", "j", {"pids": []})

    async def assert_saved(self, job: JobRef) -> None:
        assert all(self.cuda.state_of(pid) == CHECKPOINTED for pid in pids_of(job))

    async def assert_running(self, job: JobRef) -> None:
        assert all(self.cuda.state_of(pid) == RUNNING for pid in pids_of(job))
