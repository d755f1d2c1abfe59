"""A Kubernetes pod's processes, as the node's cgroups list them: what the `cuda`
backend acts on for a target that names a pod (`{"pod_uid": ...}`) instead of pids.

The kubelet puts each pod in a cgroup of its own, and each of its containers in
one below it. Where, depends on its cgroup driver (and the pod's QoS class):

- systemd: `kubepods.slice/[kubepods-burstable.slice/|kubepods-besteffort.slice/]`
  `kubepods[-burstable|-besteffort]-pod<uid, '-' as '_'>.slice/<container>.scope`;
- cgroupfs: `kubepods/[burstable/|besteffort/]pod<uid>/<container id>/`.

Under cgroup v2 these are below the cgroup root (`/sys/fs/cgroup`); under v1 below
each controller's hierarchy, of which the `memory` and `cpu,cpuacct` ones are
read when the root has no `kubepods` of its own. A pod's processes are those of
every `cgroup.procs` in its directory and below it, read anew at each operation
(containers restart their processes).

A cgroup tree may be shaped by whoever runs in it (a container with cgroup
delegation makes sub-cgroups at will), so every read is bounded: how deep below
the pod's directory, how many directories and entries, how many bytes of each
`cgroup.procs`; and symbolic links are never followed (every step opens the
next directory relative to the one before it, with `O_NOFOLLOW`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Final

from timeslice.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from timeslice.ids import check_pod_uid

DEFAULT_CGROUP_ROOT: Final = "/sys/fs/cgroup"
# The v1 hierarchies read when the root is not itself one with pods (v2's).
_V1_HIERARCHIES: Final = ("memory", "cpu,cpuacct", "cpuacct,cpu", "pids")
_QOS: Final = ("", "burstable", "besteffort")
_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True, kw_only=True)
class CgroupLimits:
    """How much of a pod's cgroup tree one lookup reads at most."""

    # Levels below the pod's own directory (its containers are one level down).
    max_depth: int = 4
    # Directories visited, and entries listed in all of them together.
    max_dirs: int = 256
    max_entries: int = 4096
    # Bytes read of one cgroup.procs, and process ids in all of them.
    max_procs_bytes: int = 256 * 1024
    max_pids: int = 4096


def pod_directories(uid: str) -> list[str]:
    """Where a pod of `uid` may be, relative to a hierarchy: every driver's layout."""
    under = uid.replace("-", "_")
    paths = []
    for qos in _QOS:
        slice_name = f"kubepods-{qos}" if qos else "kubepods"
        middle = f"{slice_name}.slice/" if qos else ""
        paths.append(f"kubepods.slice/{middle}{slice_name}-pod{under}.slice")
    for qos in _QOS:
        paths.append(f"kubepods/{qos + '/' if qos else ''}pod{uid}")
    return paths


def pod_pids(
    uid: str, root: str = DEFAULT_CGROUP_ROOT, limits: CgroupLimits | None = None
) -> tuple[int, ...]:
    """The processes of pod `uid` on this node, in ascending order (none when its
    containers have none running); NotFoundError when this node has no such pod."""
    check_pod_uid(uid)
    limits = limits or CgroupLimits()
    try:
        root_fd = os.open(root, _OPEN_DIR)
    except OSError as exc:
        raise NotFoundError(f"cannot read the cgroup root {root}: {exc.strerror}") from None
    try:
        for hierarchy in ("", *_V1_HIERARCHIES):
            for relative in pod_directories(uid):
                path = f"{hierarchy}/{relative}" if hierarchy else relative
                fd = _open_below(root_fd, path)
                if fd is not None:
                    try:
                        return _Reader(limits).pids_below(fd)
                    finally:
                        os.close(fd)
    finally:
        os.close(root_fd)
    raise NotFoundError(f"no cgroup of pod {uid} under {root}")


def _open_below(dir_fd: int, path: str) -> int | None:
    """A descriptor of directory `path` below `dir_fd`, or None if it is not one
    (or a link on the way is)."""
    fd = dir_fd
    for part in path.split("/"):
        try:
            next_fd: int | None = os.open(part, _OPEN_DIR, dir_fd=fd)
        except OSError:
            next_fd = None
        if fd != dir_fd:
            os.close(fd)
        if next_fd is None:
            return None
        fd = next_fd
    return fd


class _Reader:
    """One bounded walk of a pod's directory."""

    def __init__(self, limits: CgroupLimits) -> None:
        self.limits = limits
        self.dirs = 0
        self.entries = 0
        self.pids: set[int] = set()

    def pids_below(self, fd: int) -> tuple[int, ...]:
        self._walk(fd, 0)
        return tuple(sorted(self.pids))

    def _walk(self, fd: int, depth: int) -> None:
        self.dirs += 1
        if self.dirs > self.limits.max_dirs:
            raise ResourceExhaustedError(
                f"the pod's cgroup tree has more than {self.limits.max_dirs} directories"
            )
        self._read_procs(fd)
        if depth >= self.limits.max_depth:
            return  # deeper sub-cgroups are the containers' own business
        for name in self._subdirectories(fd):
            try:
                child = os.open(name, _OPEN_DIR, dir_fd=fd)
            except OSError:
                continue  # gone meanwhile, or a link
            try:
                self._walk(child, depth + 1)
            finally:
                os.close(child)

    def _subdirectories(self, fd: int) -> list[str]:
        names = []
        with os.scandir(fd) as entries:  # reads a copy of fd, which stays open
            for entry in entries:
                self.entries += 1
                if self.entries > self.limits.max_entries:
                    raise ResourceExhaustedError(
                        f"the pod's cgroup tree has more than {self.limits.max_entries} entries"
                    )
                if entry.is_dir(follow_symlinks=False):
                    names.append(entry.name)
        return sorted(names)

    def _read_procs(self, fd: int) -> None:
        try:
            procs = os.open("cgroup.procs", _OPEN_FILE, dir_fd=fd)
        except OSError:
            return  # not a cgroup (or a link where cgroup.procs should be)
        try:
            if not stat.S_ISREG(os.fstat(procs).st_mode):
                return
            data = _read_at_most(procs, self.limits.max_procs_bytes + 1)
        finally:
            os.close(procs)
        if len(data) > self.limits.max_procs_bytes:
            raise ResourceExhaustedError(
                f"a cgroup.procs of the pod is longer than {self.limits.max_procs_bytes} bytes"
            )
        for line in data.split():
            if not line.isdigit() or len(line) > 10:
                raise InvalidArgumentError("a cgroup.procs of the pod holds something not a pid")
            self.pids.add(int(line))
            if len(self.pids) > self.limits.max_pids:
                raise ResourceExhaustedError(
                    f"the pod has more than {self.limits.max_pids} processes"
                )


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes of `fd` (a cgroup file gives its text in several reads)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
