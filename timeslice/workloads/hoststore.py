"""Where the host-memory workload keeps an offloaded array until it is restored.

- `MemoryStore` ("memory"): a copy in a fresh anonymous mapping of this process,
  advised to use huge pages. Moving an array there costs one copy and frees its
  own mapping; nothing leaves the process, so nothing survives it either.
- `FileStore` ("file"): a file in a directory. Slower (the kernel copies the bytes
  into its page cache and back), but the bytes leave the process's own memory.

Both are keyed by the array's name and copy in pieces of `CHUNK_BYTES`: no second
copy of a whole array exists beyond the saved one, and numpy, which lets go of
the GIL while it copies, hands it back between pieces.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

import numpy as np

from timeslice.errors import ConflictError, InvalidArgumentError

# Copies, writes and reads go in pieces this large: few calls, no Python per
# element, and no second copy of a whole array in memory.
CHUNK_BYTES: Final = 64 * 1024 * 1024

# Below this a mapping cannot hold a single huge page: not worth advising.
HUGE_PAGE_BYTES: Final = 2 * 1024 * 1024

MEMORY: Final = "memory"
FILE: Final = "file"
STORES: Final = (MEMORY, FILE)


class ArrayStore(Protocol):
    """Keeps the bytes of offloaded arrays, by name, until they are loaded back."""

    kind: str

    def save(self, name: str, memory: mmap.mmap | None, nbytes: int) -> None:
        """Keep a copy of `memory` (None: an array of no bytes) under `name`."""
        ...

    def load(self, name: str, memory: mmap.mmap | None, nbytes: int) -> None:
        """Copy what `name` holds into `memory`, then drop it."""
        ...

    def drop(self, name: str) -> None:
        """Forget what `name` holds, if anything."""
        ...

    def close(self) -> None:
        """Drop everything held."""
        ...


def check_store(store: str | None, store_dir: Path | str | None) -> str:
    """The store a workload uses: `store` if given, else "file" when a directory
    is given and "memory" when not; a clear error for anything else."""
    if store is None:
        return FILE if store_dir is not None else MEMORY
    if store not in STORES:
        raise InvalidArgumentError(f"store must be 'memory' or 'file', not {store!r}")
    if store == MEMORY and store_dir is not None:
        raise InvalidArgumentError("store_dir is for store='file'; store='memory' writes no files")
    return store


def map_memory(nbytes: int) -> mmap.mmap:
    """A fresh zero-filled anonymous mapping of `nbytes` (> 0), advised to use huge
    pages where the platform has them: a first write then faults once per 2 MiB,
    not once per 4 KiB, which about triples the speed of copying into it."""
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= HUGE_PAGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without them: plain pages
            memory.madvise(mmap.MADV_HUGEPAGE)
    return memory


def copy_memory(source: mmap.mmap, target: mmap.mmap) -> None:
    """Copy `source` into `target` (as long), piece by piece."""
    src = np.frombuffer(source, np.uint8)
    dst = np.frombuffer(target, np.uint8)
    try:
        for offset in range(0, len(src), CHUNK_BYTES):
            end = offset + CHUNK_BYTES
            np.copyto(dst[offset:end], src[offset:end])
    finally:
        # No view may outlive the call (a traceback keeps the frame): each one is
        # a buffer export that would keep its mapping from being closed.
        del src, dst


class MemoryStore:
    """Offloaded arrays as copies in fresh huge-page mappings of this process."""

    kind: str = MEMORY

    def __init__(self) -> None:
        self._copies: dict[str, mmap.mmap | None] = {}

    def save(self, name: str, memory: mmap.mmap | None, nbytes: int) -> None:
        if memory is None:
            self._copies[name] = None
            return
        copy = map_memory(nbytes)
        try:
            copy_memory(memory, copy)
        except BaseException:
            copy.close()
            raise
        self._copies[name] = copy

    def load(self, name: str, memory: mmap.mmap | None, nbytes: int) -> None:
        copy = self._copies[name]
        if copy is not None and memory is not None:
            copy_memory(copy, memory)
        del self._copies[name]
        if copy is not None:
            copy.close()

    def drop(self, name: str) -> None:
        copy = self._copies.pop(name, None)
        if copy is not None:
            copy.close()

    def close(self) -> None:
        for name in list(self._copies):
            self.drop(name)

    def __repr__(self) -> str:
        return f"<MemoryStore {len(self._copies)} arrays>"


class FileStore:
    """Offloaded arrays as files in `directory` (a temporary one of its own by
    default, removed by `close`)."""

    kind: str = FILE

    def __init__(self, directory: Path | str | None = None) -> None:
        self._files: dict[str, Path] = {}
        self._next_file = 0
        self._prefix = uuid.uuid4().hex[:12]
        self._cleanup: Callable[[], object] | None = None
        if directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="timeslice-hostmem-"))
            self._cleanup = weakref.finalize(
                self, shutil.rmtree, str(self.directory), ignore_errors=True
            )
        else:
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)

    def save(self, name: str, memory: mmap.mmap | None, nbytes: int) -> None:
        # Named for this store, so that workloads sharing a directory never meet.
        path = self.directory / f"{self._prefix}-{self._next_file:06d}.bin"
        self._next_file += 1
        _write_file(path, memory)
        self._files[name] = path

    def load(self, name: str, memory: mmap.mmap | None, nbytes: int) -> None:
        path = self._files[name]
        _read_file(path, memory, nbytes)
        del self._files[name]
        path.unlink(missing_ok=True)

    def drop(self, name: str) -> None:
        path = self._files.pop(name, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        for name in list(self._files):
            self.drop(name)
        if self._cleanup is not None:
            self._cleanup()

    def __repr__(self) -> str:
        return f"<FileStore {len(self._files)} arrays in {str(self.directory)!r}>"


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
