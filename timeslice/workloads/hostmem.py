"""A workload of named numpy arrays in host memory, standing for a job's
accelerator memory: the reference workload for tests and for the demo on
machines without an accelerator.

Each array lives in an anonymous memory mapping that the workload owns, so that
a snapshot truly gives the memory back to the system (`munmap`), whatever the
allocator's thresholds, and so that a reference still held elsewhere is seen
instead of silently keeping the memory alive.

- OFFLOAD copies each selected array's bytes to the workload's store and unmaps
  its memory; restore maps fresh memory, copies them back byte for byte, and
  drops the saved copy. The store is host memory of this process (a fresh
  huge-page mapping per array: "memory") or files in a directory ("file"); see
  `timeslice.workloads.hoststore`.
- DISCARD unmaps the memory and keeps nothing. Restore then maps zero-filled
  memory of the same shape and dtype and marks the array as needing provision:
  the application fills it again (a weight sync, say) and calls `provide`.

While an array is out, using it raises `ArraySavedError`. Arrays handed out
before a snapshot must not be kept across it: their memory is freed only when
the last of them is dropped, and the snapshot reports it as not freed.
"""

from __future__ import annotations

import logging
import math
import mmap
import operator
import threading
from collections.abc import Iterable, Sequence
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
from timeslice.workloads.hoststore import (
    MEMORY,
    ArrayStore,
    FileStore,
    MemoryStore,
    check_store,
    map_memory,
)

log = logging.getLogger(__name__)

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
    discarded: bool = False
    needs_provision: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def saved(self) -> bool:
        return self.array is None


class HostMemoryWorkload:
    """Named numpy arrays that a snapshot moves out of their memory and a restore
    brings back.

    ``store`` is where offloaded arrays are kept: "memory" (a copy in host
    memory of this process) or "file" (a file in ``store_dir``: a temporary
    directory of the workload's own when not given, removed by `close`).
    Unspecified, it is "file" when ``store_dir`` is given and "memory" when not.
    Memory is the default because what a snapshot is for is freeing the memory
    the arrays stand for (an accelerator's), as fast as it can be done: one
    copy, about half again as fast as through the kernel's page cache. Files
    are for bytes that must leave the process's memory (the kernel may then
    write them out and use the RAM for other things) or be found in a directory.

    Every method is safe to call from any thread: a training loop and the
    workload channel share one lock.

    It has what `register_workload` looks for: ``snapshot(mode, tags)``,
    ``restore(tags)``, and the capabilities ``supported_modes``,
    ``default_mode``, ``tags``, ``store`` and ``pipelined``.
    """

    supported_modes: tuple[str, ...] = (OFFLOAD, DISCARD)
    default_mode: str = OFFLOAD
    # A snapshot or restore of some tags moves those only: a switch may move it tag by
    # tag, and bring the next holder in as this one goes out.
    pipelined: bool = True

    def __init__(self, store_dir: Path | str | None = None, *, store: str | None = None) -> None:
        kind = check_store(store, store_dir)
        self._lock = threading.RLock()
        self._regions: dict[str, _Region] = {}
        self._closed = False
        self._store: ArrayStore = MemoryStore() if kind == MEMORY else FileStore(store_dir)

    @property
    def store(self) -> str:
        """Where offloaded arrays are kept: "memory" or "file"."""
        return self._store.kind

    @property
    def store_dir(self) -> Path | None:
        """The directory of the file store; None for the memory store."""
        return self._store.directory if isinstance(self._store, FileStore) else None

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

        Returns ``(storage_bytes, freed_bytes)``: the bytes the store keeps (in
        host memory or files), and the arrays' memory given back to the system.
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
        self._store.save(region.name, region.memory, region.nbytes)
        return region.nbytes

    def _reload(self, region: _Region) -> int:
        _map(region)
        try:
            self._store.load(region.name, region.memory, region.nbytes)
        except BaseException:
            _unmap(region)
            raise
        return region.nbytes

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Drops every array and saved copy (and the temporary directory). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for region in self._regions.values():
                _unmap(region)
            self._regions.clear()
            self._store.close()

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
                f" {out} out, {self._store!r}>"
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
    # Huge pages, as numpy asks for its own large arrays: fewer faults when the
    # array is first written, and a copy out of it runs about half again as fast.
    memory = map_memory(region.nbytes)
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
