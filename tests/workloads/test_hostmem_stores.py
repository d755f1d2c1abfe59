"""The host-memory workload's two stores: which one a workload uses, that the
memory store keeps its copy in a mapping of its own and writes no file, that the
file store writes files, and that both bring back every byte across pieces.

What both do alike (tags, DISCARD, references kept elsewhere, races) is tested
with each store in tests/unit/test_hostmem.py."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from timeslice.errors import InvalidArgumentError
from timeslice.workloads import HostMemoryWorkload, hoststore

MiB = 1024 * 1024


def mappings(at_least: int) -> set[tuple[int, int]]:
    """The (start, end) of every mapping of this process of `at_least` bytes."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(n, 16) for n in line.split()[0].split("-"))
            if end - start >= at_least:
                found.add((start, end))
    return found


def mapped(address: int, size: int) -> bool:
    """Whether one mapping of this process holds the `size` bytes at `address`."""
    return any(start <= address and address + size <= end for start, end in mappings(size))


def test_the_store_is_memory_unless_a_directory_or_file_is_asked_for(tmp_path: Path) -> None:
    with HostMemoryWorkload() as default:
        assert (default.store, default.store_dir) == ("memory", None)
    with HostMemoryWorkload(tmp_path) as given_a_directory:
        assert (given_a_directory.store, given_a_directory.store_dir) == ("file", tmp_path)
    with HostMemoryWorkload(store="file") as temporary:
        assert temporary.store == "file" and temporary.store_dir is not None
    with HostMemoryWorkload(store="memory") as memory:
        assert memory.store == "memory"
    assert "MemoryStore" in repr(memory) and "FileStore" in repr(temporary)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"store": "disk"}, "store must be 'memory' or 'file', not 'disk'"),
        ({"store": ""}, "store must be 'memory' or 'file', not ''"),
        ({"store": "memory", "store_dir": "/tmp/x"}, "store_dir is for store='file'"),
    ],
)
def test_a_store_it_cannot_use_is_refused(arguments: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        HostMemoryWorkload(**arguments)


def test_the_memory_store_unmaps_the_array_and_keeps_a_mapping_of_its_own() -> None:
    size = 16 * MiB
    with HostMemoryWorkload(store="memory") as workload:
        array = workload.allocate("big", size, np.uint8)
        array[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)
        live = array.ctypes.data
        del array
        before = mappings(size)
        assert mapped(live, size)

        stored, freed = workload.snapshot("offload")
        assert stored == freed == size
        assert not mapped(live, size), "the array's own mapping is still there"
        (saved,) = mappings(size) - before  # the copy, in a mapping of its own
        assert saved[1] - saved[0] >= size

        workload.restore()
        assert saved not in mappings(size), "the saved copy outlived the restore"
        restored = workload["big"]
        assert mapped(restored.ctypes.data, size)
        assert restored.tobytes() == np.arange(size, dtype=np.uint64).astype(np.uint8).tobytes()

        del restored
        before = mappings(size)
        workload.snapshot("offload")
        kept = mappings(size) - before
        assert len(kept) == 1
    assert not kept & mappings(size), "close left the saved copy mapped"


def test_discard_keeps_no_copy_in_the_memory_store() -> None:
    size = 8 * MiB
    with HostMemoryWorkload(store="memory") as workload:
        workload.allocate("w", size, np.uint8)[:] = 7
        before = mappings(size)
        assert workload.snapshot("discard") == (0, size)
        assert not mappings(size) - before
        workload.restore()
        assert workload.needs_provision == {"w"} and not workload["w"].any()


def test_the_memory_store_writes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a file store would go
    with HostMemoryWorkload() as workload:
        workload.add("a", np.arange(1000))
        workload.snapshot("offload")
        workload.restore()
        workload.snapshot("offload")
        assert list(tmp_path.iterdir()) == []


def test_the_file_store_writes_one_file_per_array(tmp_path: Path) -> None:
    with HostMemoryWorkload(tmp_path, store="file") as workload:
        workload.add("a", np.arange(1000, dtype=np.int64))
        workload.add("b", np.zeros(3, dtype=np.int8))
        workload.snapshot("offload")
        assert sorted(f.stat().st_size for f in tmp_path.iterdir()) == [3, 8000]
        workload.restore()
        assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("store", ["memory", "file"])
def test_every_byte_comes_back_across_many_pieces(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hoststore, "CHUNK_BYTES", 1 * MiB + 3)  # pieces that split pages
    data = np.frombuffer(np.random.default_rng(5).bytes(5 * MiB + 11), np.uint8)
    with HostMemoryWorkload(store=store) as workload:
        workload.add("x", data)
        workload.add("y", data[: 2 * MiB].view(np.float64))
        assert workload.snapshot("offload") == (7 * MiB + 11, 7 * MiB + 11)
        workload.restore()
        assert workload["x"].tobytes() == data.tobytes()
        assert workload["y"].tobytes() == data[: 2 * MiB].tobytes()
