"""The `cuda` backend on a target that names a pod: its processes are those of the
pod's cgroups (a synthetic tree) that the driver knows, read anew at each operation."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from tests.fakes.fake_cuda import CHECKPOINTED, RUNNING, FakeCuda, FakeNvml
from tests.unit.test_cgroups import UID, container, systemd_pod
from timeslice.agent.channels import WorkloadChannels
from timeslice.api.backend_config import backend_of, names_pod
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import BackendContext, JobRef
from timeslice.backends.cuda import CudaBackend, CudaTimeouts
from timeslice.errors import InvalidArgumentError, NotFoundError

pytestmark = pytest.mark.timeout(10)

FAST = CudaTimeouts(lock_timeout_s=0.2, transfer_timeout_s=0.3, call_timeout_s=0.3)


@pytest.fixture
def spawn() -> Iterator[Callable[[], int]]:
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
async def setup(tmp_path: Path) -> AsyncIterator[tuple[CudaBackend, FakeCuda]]:
    cuda = FakeCuda()
    context = BackendContext("node-1", WorkloadChannels(), {}, cgroup_root=str(tmp_path))
    backend = CudaBackend(context, cuda.module(), FakeNvml(cuda).module(), timeouts=FAST)
    yield backend, cuda
    cuda.release()
    await backend.close()


async def test_a_pod_target_acts_on_the_pods_cuda_processes(
    setup: tuple[CudaBackend, FakeCuda], tmp_path: Path, spawn: Callable[[], int]
) -> None:
    backend, cuda = setup
    trainer, pause, other = spawn(), spawn(), spawn()
    cuda.add_process(trainer)
    cuda.add_process(other)  # a CUDA process, but of another pod
    pod = systemd_pod(tmp_path, UID)
    container(pod, "cri-containerd-pause.scope", [pause])  # no CUDA: not the job's
    box = container(pod, "cri-containerd-trainer.scope", [trainer])
    job = JobRef("g", "j", {"pod_uid": UID})
    assert await backend.check(job) == (f"pod:{UID}",)
    await backend.snapshot(job, {"timeout": 5})
    assert cuda.state_of(trainer) == CHECKPOINTED
    assert cuda.state_of(other) == RUNNING
    assert await backend.state(job) == "SAVED"
    await backend.restore(job, {"timeout": 5})
    assert cuda.state_of(trainer) == RUNNING
    # The container restarted its process: the next operation finds the new one.
    restarted = spawn()
    cuda.add_process(restarted)
    (box / "cgroup.procs").write_text(f"{restarted}\n")
    await backend.snapshot(job, {"timeout": 5})
    assert cuda.state_of(restarted) == CHECKPOINTED
    assert cuda.state_of(trainer) == RUNNING


async def test_a_pod_without_cuda_processes_or_cgroup_is_not_found(
    setup: tuple[CudaBackend, FakeCuda], tmp_path: Path, spawn: Callable[[], int]
) -> None:
    backend, _ = setup
    with pytest.raises(NotFoundError, match="no cgroup of pod"):
        await backend.check(JobRef("g", "j", {"pod_uid": UID}))
    container(systemd_pod(tmp_path, UID), "c.scope", [spawn()])
    with pytest.raises(NotFoundError, match="no CUDA process"):
        await backend.snapshot(JobRef("g", "j", {"pod_uid": UID}), {"timeout": 5})


@pytest.mark.parametrize(
    "config", [{"pod_uid": "../etc"}, {"pod_uid": UID, "pids": [5]}, {"pod_uid": 7}]
)
async def test_a_bad_pod_target_is_refused(
    setup: tuple[CudaBackend, FakeCuda], config: dict[str, object]
) -> None:
    with pytest.raises(InvalidArgumentError, match="pod_uid"):
        await setup[0].check(JobRef("g", "j", config))


def test_the_wire_names_a_pod_or_pids_never_both() -> None:
    target = pb.ProcessTarget(pod_uid=UID)
    config = pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=target))
    assert backend_of(config, pb.Backend.UNSPECIFIED) == ("cuda", {"pod_uid": UID}, {})
    assert names_pod(config)
    pids = pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=pb.ProcessTarget(pids=[9])))
    assert not names_pod(pids) and not names_pod(None)
    both = pb.ProcessTarget(pod_uid=UID, pids=[9])
    with pytest.raises(InvalidArgumentError, match="not both"):
        backend_of(
            pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=both)),
            pb.Backend.UNSPECIFIED,
        )
    bad = pb.ProcessTarget(pod_uid="/etc/passwd")
    with pytest.raises(InvalidArgumentError, match="pod_uid"):
        backend_of(
            pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=bad)), pb.Backend.UNSPECIFIED
        )
