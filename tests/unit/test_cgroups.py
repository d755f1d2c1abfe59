"""A pod's processes through a synthetic cgroup tree: both kubelet drivers, cgroup v1's
fallback, and hostile trees (deep, wide, huge files, links out) bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from timeslice.backends._cgroups import CgroupLimits, pod_pids
from timeslice.ids import check_pod_uid
from timeslice.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError

UID = "0d5b7c1e-3f2a-4b6c-9d8e-1a2b3c4d5e6f"
OTHER = "11111111-2222-3333-4444-555555555555"


def container(pod_dir: Path, name: str, pids: list[int]) -> Path:
    path = pod_dir / name
    path.mkdir(parents=True)
    (path / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    return path


def systemd_pod(root: Path, uid: str, qos: str = "burstable") -> Path:
    under = uid.replace("-", "_")
    if qos:
        pod = root / f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice"
    else:
        pod = root / f"kubepods.slice/kubepods-pod{under}.slice"
    pod.mkdir(parents=True)
    (pod / "cgroup.procs").write_text("")
    return pod


def cgroupfs_pod(root: Path, uid: str, qos: str = "besteffort") -> Path:
    pod = root / "kubepods" / qos / f"pod{uid}" if qos else root / "kubepods" / f"pod{uid}"
    pod.mkdir(parents=True)
    return pod


@pytest.mark.parametrize("qos", ["", "burstable", "besteffort"])
def test_systemd_driver_layout(tmp_path: Path, qos: str) -> None:
    pod = systemd_pod(tmp_path, UID, qos)
    container(pod, "cri-containerd-aaa.scope", [200, 201])
    container(pod, "cri-containerd-bbb.scope", [300])
    other = systemd_pod(tmp_path, OTHER, "besteffort" if qos == "burstable" else "burstable")
    container(other, "cri-containerd-ccc.scope", [999])
    assert pod_pids(UID, str(tmp_path)) == (200, 201, 300)
    assert pod_pids(OTHER, str(tmp_path)) == (999,)


@pytest.mark.parametrize("qos", ["", "burstable", "besteffort"])
def test_cgroupfs_driver_layout(tmp_path: Path, qos: str) -> None:
    pod = cgroupfs_pod(tmp_path, UID, qos)
    container(pod, "4f1c0ffee", [42, 43])
    container(pod, "pause0", [41])
    assert pod_pids(UID, str(tmp_path)) == (41, 42, 43)


def test_cgroup_v1_falls_back_to_a_controller_hierarchy(tmp_path: Path) -> None:
    (tmp_path / "systemd").mkdir()  # v1's named hierarchy, no pods of its own here
    pod = cgroupfs_pod(tmp_path / "memory", UID, "burstable")
    container(pod, "abc", [7001])
    assert pod_pids(UID, str(tmp_path)) == (7001,)
    pod = systemd_pod(tmp_path / "cpu,cpuacct", OTHER)
    container(pod, "x.scope", [7002])
    assert pod_pids(OTHER, str(tmp_path)) == (7002,)


def test_processes_are_read_anew_at_each_lookup(tmp_path: Path) -> None:
    pod = systemd_pod(tmp_path, UID)
    box = container(pod, "c.scope", [10])
    assert pod_pids(UID, str(tmp_path)) == (10,)
    (box / "cgroup.procs").write_text("11\n12\n")
    assert pod_pids(UID, str(tmp_path)) == (11, 12)


def test_an_unknown_pod_or_root_is_not_found(tmp_path: Path) -> None:
    container(systemd_pod(tmp_path, OTHER), "c.scope", [10])
    with pytest.raises(NotFoundError, match="no cgroup of pod"):
        pod_pids(UID, str(tmp_path))
    with pytest.raises(NotFoundError, match="cgroup root"):
        pod_pids(UID, str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "uid", ["", "ABCDEF12-0000", "../../etc", "0d5b7c1e/../x", "x" * 10, "a" * 65, 5]
)
def test_a_pod_uid_is_checked(uid: object) -> None:
    with pytest.raises(InvalidArgumentError, match="pod_uid"):
        check_pod_uid(uid)


def test_links_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    container(outside, "c", [666])
    root = tmp_path / "root"
    pod = systemd_pod(root, UID)
    container(pod, "c.scope", [10])
    os.symlink(outside / "c", pod / "linked.scope")  # a link to another tree's cgroup
    (pod / "cgroup.procs").unlink()
    os.symlink(outside / "c" / "cgroup.procs", pod / "cgroup.procs")
    assert pod_pids(UID, str(root)) == (10,)
    # A pod directory that is itself a link is not the pod's.
    (root / "kubepods").mkdir()
    os.symlink(outside, root / "kubepods" / f"pod{OTHER}")
    with pytest.raises(NotFoundError):
        pod_pids(OTHER, str(root))


def test_a_deep_tree_is_read_only_to_the_depth_limit(tmp_path: Path) -> None:
    pod = systemd_pod(tmp_path, UID)
    level = pod
    for depth in range(1, 40):
        level = container(level, f"d{depth}", [1000 + depth])
    assert pod_pids(UID, str(tmp_path), CgroupLimits(max_depth=3)) == (1001, 1002, 1003)


def test_a_wide_tree_is_refused(tmp_path: Path) -> None:
    pod = systemd_pod(tmp_path, UID)
    for i in range(50):
        (pod / f"c{i}.scope").mkdir()
    with pytest.raises(ResourceExhaustedError, match="directories"):
        pod_pids(UID, str(tmp_path), CgroupLimits(max_dirs=20))
    for i in range(50):
        (pod / f"f{i}").write_text("")
    with pytest.raises(ResourceExhaustedError, match="entries"):
        pod_pids(UID, str(tmp_path), CgroupLimits(max_entries=60))


def test_a_huge_procs_file_is_refused(tmp_path: Path) -> None:
    pod = systemd_pod(tmp_path, UID)
    container(pod, "c.scope", list(range(2, 3000)))
    with pytest.raises(ResourceExhaustedError, match="bytes"):
        pod_pids(UID, str(tmp_path), CgroupLimits(max_procs_bytes=4096))
    with pytest.raises(ResourceExhaustedError, match="processes"):
        pod_pids(UID, str(tmp_path), CgroupLimits(max_pids=100))
    (pod / "c.scope" / "cgroup.procs").write_text("12\nnot-a-pid\n")
    with pytest.raises(InvalidArgumentError, match="not a pid"):
        pod_pids(UID, str(tmp_path))
