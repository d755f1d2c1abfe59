"""A workload of named numpy arrays in host memory, standing for a job's
accelerator memory: the reference workload for tests and for the demo on
machines without an accelerator.

Each array lives in an anonymous memory mapping that the workload owns, so that
a snapshot truly gives the memory back to the system (`munmap`), whatever the
allocator's thresholds, and so that a reference still held elsewhere is seen
instead of silently keeping the memory alive.

- OFFLOAD writes each selected array's bytes to a file in `store_dir` and
  unmaps its memory; restore reads them back, byte for byte, and removes the file.
- DISCARD unmaps the memory and keeps nothing. Restore then maps zero-filled
  memory of the same shape and dtype and marks the array as needing provision:
  the application fills it again (a weight sync, say) and calls `provide`.

While an array is out, using it raises `ArraySavedError`. Arrays handed out
before a snapshot must not be kept across it: their memory is freed only when
the last of them is dropped, and the snapshot reports it as not freed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import operator
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, SupportsIndex

import numpy as np
import numpy.typing as npt

from timeslice.backends import DISCARD, OFFLOAD, parse_mode
from timeslice.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
)

log = logging.getLogger(__name__)

# Files are written and read in pieces this large: few system calls, no Python
# per element, and no second copy of a whole array in memory.
CHUNK_BYTES: Final = 64 * 1024 * 1024

RUNNING: Final = "RUNNING"
SAVED: Final = "SAVED"


class ArraySavedError(ConflictError):
    """An array was used while it is out of memory (snapshotted, not yet restored)."""


@dataclass(eq=False)
class _Region:
    """One named array and where its bytes are."""

    name: str
    tags: frozenset[str]
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    memory: mmap.mmap | None = None
    array: npt.NDArray[Any] | None = None
    file: Path | None = None
    discarded: bool = False
    needs_provision: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def saved(self) -> bool:
        return self.array is None


class HostMemoryWorkload:
    """Named numpy arrays that a snapshot moves out of the process and a restore
    brings back.

    ``store_dir`` is where offloaded arrays go (a temporary directory of the
    workload's own by default, removed by `close`). Every method is safe to
    call from any thread: a training loop and the workload channel share one lock.

    It has what `register_workload` looks for: ``snapshot(mode, tags)``,
    ``restore(tags)``, and the capabilities ``supported_modes``,
    ``default_mode`` and ``tags``.
    """

    supported_modes: tuple[str, ...] = (OFFLOAD, DISCARD)
    default_mode: str = OFFLOAD

    def __init__(self, store_dir: Path | str | None = None) -> None:
        self._lock = threading.RLock()
        self._regions: dict[str, _Region] = {}
        self._next_file = 0
        self._file_prefix = uuid.uuid4().hex[:12]
        self._closed = False
        self._cleanup: Callable[[], object] | None = None
        if store_dir is None:
            self._store_dir = Path(tempfile.mkdtemp(prefix="timeslice-hostmem-"))
            self._cleanup = weakref.finalize(
                self, shutil.rmtree, str(self._store_dir), ignore_errors=True
            )
        else:
            self._store_dir = Path(store_dir)
            self._store_dir.mkdir(parents=True, exist_ok=True)

    # --- arrays -------------------------------------------------------------------------

    def allocate(
        self,
        name: str,
        shape: SupportsIndex | Sequence[SupportsIndex],
        dtype: npt.DTypeLike = np.float32,
        tags: Iterable[str] = ("default",),
    ) -> npt.NDArray[Any]:
        """Adds a zero-filled array of the workload's own memory and returns it, to be
        filled in place (no second copy of the data, unlike `add`)."""
        if isinstance(shape, Sequence):
            dims = tuple(operator.index(n) for n in shape)
        else:
            dims = (operator.index(shape),)
        if any(n < 0 for n in dims):
            raise InvalidArgumentError(f"array {name!r}: negative dimension in {dims}")
        kind = np.dtype(dtype)
        if kind.hasobject:
            raise InvalidArgumentError(
                f"array {name!r}: dtype {kind} holds Python objects, whose bytes cannot be saved"
            )
        tag_set = _check_tags(name, tags)
        with self._lock:
            self._check_open()
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError("an array's name must be a non-empty string")
            if name in self._regions:
                raise AlreadyExistsError(f"the workload has an array named {name!r} already")
            region = _Region(name, tag_set, dims, kind)
            _map(region)
            self._regions[name] = region
            assert region.array is not None
            return region.array

    def add(
        self, name: str, array: npt.ArrayLike, tags: Iterable[str] = ("default",)
    ) -> npt.NDArray[Any]:
        """Adds a copy of `array` (in C order, whatever the input's layout) under
        `name`, carrying `tags`; returns the workload's array."""
        source = np.asarray(array)
        target = self.allocate(name, source.shape, source.dtype, tags)
        np.copyto(target, source, casting="no")
        return target

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        """The array named `name`; `ArraySavedError` while it is out."""
        with self._lock:
            return self._live(self._region(name))

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._regions

    @property
    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Every array by name; `ArraySavedError` while any is out."""
        with self._lock:
            return {name: self._live(region) for name, region in self._regions.items()}

    @property
    def names(self) -> tuple[str, ...]:
        """The arrays' names, in the order they were added."""
        with self._lock:
            return tuple(self._regions)

    @property
    def tags(self) -> tuple[str, ...]:
        """Every tag some array carries, sorted."""
        with self._lock:
            return tuple(sorted({tag for r in self._regions.values() for tag in r.tags}))

    def tags_of(self, name: str) -> frozenset[str]:
        """The tags array `name` carries."""
        with self._lock:
            return self._region(name).tags

    @property
    def nbytes(self) -> int:
        """The size of every array together, in memory or not."""
        with self._lock:
            return sum(r.nbytes for r in self._regions.values())

    @property
    def saved(self) -> frozenset[str]:
        """The names of the arrays that are out of memory now."""
        with self._lock:
            return frozenset(r.name for r in self._regions.values() if r.saved)

    @property
    def state(self) -> str:
        """Where the arrays are: SAVED while any is out of memory, else RUNNING."""
        return SAVED if self.saved else RUNNING

    @property
    def needs_provision(self) -> frozenset[str]:
        """Arrays restored after a DISCARD: zero-filled until the application `provide`s them."""
        with self._lock:
            return frozenset(r.name for r in self._regions.values() if r.needs_provision)

    def provide(self, name: str, data: npt.ArrayLike) -> None:
        """Fills array `name` with `data` (same shape; cast safely) and clears its
        need for provision."""
        with self._lock:
            region = self._region(name)
            target = self._live(region)
            source = np.asarray(data)
            if source.shape != target.shape:
                raise InvalidArgumentError(
                    f"array {name!r} has shape {target.shape}, not {source.shape}"
                )
            np.copyto(target, source, casting="same_kind")
            region.needs_provision = False

    # --- snapshot and restore -----------------------------------------------------------

    def snapshot(self, mode: str = OFFLOAD, tags: Iterable[str] = ()) -> tuple[int, int]:
        """Moves the selected arrays out of memory: every array when `tags` is empty,
        else those carrying one of them. Arrays already out are left as they are.

        Returns ``(storage_bytes, freed_bytes)``: the bytes written to files, and
        the memory given back to the system.
        """
        mode = parse_mode(mode)
        with self._lock:
            self._check_open()
            stored = freed = 0
            for region in self._select(tags):
                if region.saved:
                    continue
                if mode == OFFLOAD:
                    stored += self._offload(region)
                else:
                    region.discarded = True
                freed += _unmap(region)
            return stored, freed

    def restore(self, tags: Iterable[str] = ()) -> tuple[int, int]:
        """Brings the selected arrays back into memory, byte-exact for offloaded ones,
        zero-filled (and marked `needs_provision`) for discarded ones.

        Returns ``(storage_bytes_read, restored_bytes)``.
        """
        with self._lock:
            self._check_open()
            read = restored = 0
            for region in self._select(tags):
                if not region.saved:
                    continue
                if region.discarded:
                    _map(region)
                    region.discarded = False
                    region.needs_provision = region.nbytes > 0
                else:
                    read += self._reload(region)
                restored += region.nbytes
            return read, restored

    def _offload(self, region: _Region) -> int:
        # Named for this workload, so that workloads sharing a directory never meet.
        path = self._store_dir / f"{self._file_prefix}-{self._next_file:06d}.bin"
        self._next_file += 1
        _write_file(path, region.memory)
        region.file = path
        return region.nbytes

    def _reload(self, region: _Region) -> int:
        assert region.file is not None
        _map(region)
        try:
            _read_file(region.file, region.memory, region.nbytes)
        except BaseException:
            _unmap(region)
            raise
        region.file.unlink(missing_ok=True)
        region.file = None
        return region.nbytes

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Drops every array and file (and the temporary store). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for region in self._regions.values():
                _unmap(region)
                if region.file is not None:
                    region.file.unlink(missing_ok=True)
            self._regions.clear()
            if self._cleanup is not None:
                self._cleanup()

    def __enter__(self) -> HostMemoryWorkload:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        with self._lock:
            out = sum(1 for r in self._regions.values() if r.saved)
            return (
                f"<HostMemoryWorkload {len(self._regions)} arrays, {self.nbytes} bytes,"
                f" {out} out, store {str(self._store_dir)!r}>"
            )

    # --- helpers ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConflictError("the host-memory workload is closed")

    def _region(self, name: str) -> _Region:
        region = self._regions.get(name)
        if region is None:
            known = ", ".join(repr(n) for n in self._regions) or "none"
            raise NotFoundError(f"no array named {name!r}; the workload has {known}")
        return region

    def _live(self, region: _Region) -> npt.NDArray[Any]:
        if region.array is None:
            how = "discarded" if region.discarded else "offloaded"
            raise ArraySavedError(
                f"array {region.name!r} is out of memory ({how} by a snapshot); restore it first"
            )
        return region.array

    def _select(self, tags: Iterable[str]) -> list[_Region]:
        wanted = set(tags)
        if not wanted:
            return list(self._regions.values())
        chosen = [r for r in self._regions.values() if r.tags & wanted]
        if not chosen:
            raise InvalidArgumentError(
                f"no array carries any of the tags {sorted(wanted)}; known tags: {list(self.tags)}"
            )
        return chosen


def _check_tags(name: str, tags: Iterable[str]) -> frozenset[str]:
    if isinstance(tags, str):
        raise InvalidArgumentError(
            f"array {name!r}: tags must be a list of strings, not one string"
        )
    tag_set = frozenset(tags)
    if not tag_set or not all(isinstance(t, str) and t for t in tag_set):
        raise InvalidArgumentError(f"array {name!r}: tags must be non-empty strings, at least one")
    return tag_set


def _map(region: _Region) -> None:
    """Gives `region` fresh zero-filled memory of its own mapping."""
    if region.nbytes == 0:
        region.memory = None
        region.array = np.zeros(region.shape, region.dtype)
        return
    memory = mmap.mmap(-1, region.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if region.nbytes >= 2 * 1024 * 1024 and hasattr(mmap, "MADV_HUGEPAGE"):
        # Fewer page faults when the array is first written; as numpy does itself.
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_HUGEPAGE)
    # frombuffer keeps a buffer export on the mapping for as long as any view of the
    # array lives, so the mapping cannot be closed under an array still in use.
    flat = np.frombuffer(memory, dtype=region.dtype, count=math.prod(region.shape))
    region.memory = memory
    region.array = flat.reshape(region.shape)


def _unmap(region: _Region) -> int:
    """Drops `region`'s memory; returns the bytes given back to the system now."""
    memory, region.memory, region.array = region.memory, None, None
    if memory is None:
        return 0
    try:
        memory.close()
    except BufferError:
        # An array handed out earlier is still referenced: the mapping goes when
        # the last such reference does, not now.
        log.warning(
            "array %r is still referenced outside the workload; its %d bytes are freed"
            " only when that reference is dropped",
            region.name,
            region.nbytes,
        )
        return 0
    return region.nbytes


def _write_file(path: Path, memory: mmap.mmap | None) -> None:
    """Write `memory` to a new file at `path`; a file that is there already is left
    alone (FileExistsError), one half written by this call is removed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if memory is not None:
            with memoryview(memory) as view:
                offset = 0
                while offset < len(view):
                    offset += os.write(fd, view[offset : offset + CHUNK_BYTES])
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def _read_file(path: Path, memory: mmap.mmap | None, size: int) -> None:
    with open(path, "rb", buffering=0) as file:
        found = os.fstat(file.fileno()).st_size
        if found != size:
            raise ConflictError(f"{path} holds {found} bytes, not the {size} expected")
        if memory is None:
            return
        with memoryview(memory) as view:
            offset = 0
            while offset < size:
                got = file.readinto(view[offset : offset + CHUNK_BYTES])
                if not got:
                    raise ConflictError(f"{path} ended after {offset} of {size} bytes")
                offset += got
