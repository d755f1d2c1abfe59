"""The host-memory workload: what a snapshot frees, what a restore brings back,
with either store (what is particular to each: tests/workloads/test_hostmem_stores.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from timeslice.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
)
from timeslice.workloads import ArraySavedError, HostMemoryWorkload

MiB = 1024 * 1024


@pytest.fixture(params=["memory", "file"])
def workload(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HostMemoryWorkload]:
    if request.param == "file":
        made = HostMemoryWorkload(tmp_path / "store", store="file")
    else:
        made = HostMemoryWorkload(store="memory")
    with made as w:
        assert w.store == request.param
        yield w


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> npt.NDArray[Any]:
    kind = np.dtype(dtype)
    raw = rng.bytes(int(np.prod(shape, dtype=np.int64)) * kind.itemsize)
    return np.frombuffer(raw, dtype=kind).reshape(shape).copy()


EXAMPLES: list[tuple[tuple[int, ...], Any]] = [
    ((3, 4, 5), np.float32),
    ((1000,), np.int64),
    ((7, 3), np.complex128),
    ((17,), np.bool_),
    ((2, 2, 2, 2), np.float16),
    ((5,), np.dtype(">i4")),
    ((4,), np.dtype([("a", "<u2"), ("b", "<f8", (3,))])),
    ((), np.float64),
    ((0, 3), np.float32),
    ((3 * MiB,), np.uint8),  # large enough for huge pages
]


@pytest.mark.parametrize(("shape", "dtype"), EXAMPLES)
def test_restore_brings_back_every_byte(
    workload: HostMemoryWorkload, shape: tuple[int, ...], dtype: Any
) -> None:
    original = random_array(np.random.default_rng(1), shape, dtype)
    workload.add("x", original)
    workload.snapshot("offload")
    assert workload.state == "SAVED"
    workload.restore()
    restored = workload["x"]
    assert workload.state == "RUNNING"
    assert restored.dtype == original.dtype and restored.shape == original.shape
    assert restored.flags.c_contiguous and restored.flags.writeable
    assert restored.tobytes() == original.tobytes()


def test_non_contiguous_inputs_are_copied_in_c_order(workload: HostMemoryWorkload) -> None:
    rng = np.random.default_rng(2)
    fortran = np.asfortranarray(random_array(rng, (6, 5), np.float64))
    strided = random_array(rng, (40, 30), np.int32)[::3, 1::2]
    transposed = random_array(rng, (3, 4, 5), np.float32).transpose(2, 0, 1)
    for name, array in (("f", fortran), ("s", strided), ("t", transposed)):
        workload.add(name, array)
    workload.snapshot("offload")
    workload.restore()
    for name, array in (("f", fortran), ("s", strided), ("t", transposed)):
        assert workload[name].flags.c_contiguous
        np.testing.assert_array_equal(workload[name], array)
        assert workload[name].tobytes() == np.ascontiguousarray(array).tobytes()


def test_the_workload_owns_a_copy(workload: HostMemoryWorkload) -> None:
    source = np.arange(10, dtype=np.int16)
    stored = workload.add("x", source)
    source[:] = 0
    np.testing.assert_array_equal(stored, np.arange(10))
    assert workload["x"] is stored


def test_tags_select_which_arrays_move(workload: HostMemoryWorkload) -> None:
    workload.add("base", np.ones(100), tags=["weights"])
    workload.add("lora_a", np.full(10, 2.0), tags=["lora", "adapter"])
    workload.add("lora_b", np.full(10, 3.0), tags=["lora"])
    workload.add("kv", np.zeros(50), tags=["kv_cache"])
    assert workload.tags == ("adapter", "kv_cache", "lora", "weights")

    stored, freed = workload.snapshot("offload", ["lora"])
    assert stored == freed == 2 * 10 * 8
    assert workload.saved == {"lora_a", "lora_b"}
    assert workload.state == "SAVED"
    assert workload["base"].sum() == 100  # the rest stays usable

    workload.snapshot("offload", ["weights", "lora"])  # the saved ones are left alone
    assert workload.saved == {"base", "lora_a", "lora_b"}

    read, restored = workload.restore(["adapter"])
    assert read == restored == 80
    assert workload.saved == {"base", "lora_b"}
    workload.restore()
    assert workload.saved == frozenset() and workload.state == "RUNNING"
    assert workload["lora_b"].sum() == 30.0


def test_unknown_tags_are_refused(workload: HostMemoryWorkload) -> None:
    workload.add("x", np.ones(3), tags=["weights"])
    with pytest.raises(InvalidArgumentError, match="known tags: \\['weights'\\]"):
        workload.snapshot("offload", ["kv_cache"])
    assert workload.state == "RUNNING"


def test_an_offload_snapshot_to_files_gives_the_memory_back(tmp_path: Path) -> None:
    workload = HostMemoryWorkload(tmp_path, store="file")
    size = 256 * MiB
    array = workload.allocate("big", size, np.uint8)
    array.fill(0x5A)  # touch every page
    del array
    before = rss_bytes()
    stored, freed = workload.snapshot("offload")
    after = rss_bytes()
    assert stored == freed == size
    assert before - after >= 0.9 * size, f"RSS fell by {(before - after) / MiB:.0f} MiB only"

    workload.restore()
    assert rss_bytes() - after >= 0.9 * size
    assert np.all(workload["big"] == 0x5A)
    workload.close()


def test_files_are_removed_after_restore(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with HostMemoryWorkload(store) as workload:
        workload.add("a", np.arange(1000))
        workload.add("b", np.arange(10.0), tags=["other"])
        workload.snapshot("offload")
        assert len(list(store.iterdir())) == 2
        assert sum(f.stat().st_size for f in store.iterdir()) == 1000 * 8 + 10 * 8
        workload.restore(["other"])
        assert len(list(store.iterdir())) == 1
        workload.restore()
        assert list(store.iterdir()) == []
        workload.snapshot("offload")
    assert list(store.iterdir()) == []  # close removes what is left, keeps a given directory
    assert store.is_dir()


def test_the_default_file_store_is_a_temporary_directory_removed_on_close() -> None:
    workload = HostMemoryWorkload(store="file")
    workload.add("a", np.arange(10))
    workload.snapshot("offload")
    store = workload.store_dir
    assert store is not None and store.is_dir() and any(store.iterdir())
    workload.close()
    assert not store.exists()
    workload.close()  # idempotent
    with pytest.raises(ConflictError, match="closed"):
        workload.snapshot("offload")


def test_using_an_array_while_it_is_out_raises(workload: HostMemoryWorkload) -> None:
    workload.add("w", np.ones(4), tags=["weights"])
    workload.add("kv", np.ones(4), tags=["kv_cache"])
    workload.snapshot("offload", ["weights"])
    with pytest.raises(ArraySavedError, match="'w' is out of memory .*offloaded.*restore it"):
        workload["w"]
    with pytest.raises(ArraySavedError):
        workload.arrays
    with pytest.raises(ArraySavedError):
        workload.provide("w", np.zeros(4))
    assert workload["kv"].sum() == 4
    workload.restore()
    assert set(workload.arrays) == {"w", "kv"}


def test_discard_keeps_nothing_and_restore_asks_for_provision(
    workload: HostMemoryWorkload,
) -> None:
    workload.add("weights", np.arange(6, dtype=np.float32).reshape(2, 3), tags=["weights"])
    workload.add("kv", np.ones(8), tags=["kv_cache"])
    stored, freed = workload.snapshot("discard", ["weights"])
    assert (stored, freed) == (0, 24)
    with pytest.raises(ArraySavedError, match="discarded"):
        workload["weights"]

    read, restored = workload.restore()
    assert (read, restored) == (0, 24)
    assert workload.needs_provision == {"weights"}
    assert workload["weights"].shape == (2, 3) and workload["weights"].dtype == np.float32
    assert not workload["weights"].any()

    workload.provide("weights", np.arange(6).reshape(2, 3))
    assert workload.needs_provision == frozenset()
    np.testing.assert_array_equal(workload["weights"], np.arange(6).reshape(2, 3))
    with pytest.raises(InvalidArgumentError, match="shape"):
        workload.provide("weights", np.zeros(6))


def test_a_reference_kept_elsewhere_is_not_counted_as_freed(
    workload: HostMemoryWorkload, caplog: pytest.LogCaptureFixture
) -> None:
    workload.add("a", np.arange(1000, dtype=np.int64))
    workload.add("b", np.arange(1000, dtype=np.int64))
    kept = workload["a"][10:20]  # a view keeps the whole mapping alive
    stored, freed = workload.snapshot("offload")
    assert (stored, freed) == (16000, 8000)
    assert "'a' is still referenced" in caplog.text
    np.testing.assert_array_equal(kept, np.arange(10, 20))  # still safe to read
    workload.restore()
    np.testing.assert_array_equal(workload["a"], np.arange(1000))
    assert workload["a"] is not kept.base


def test_invalid_arguments_are_refused(workload: HostMemoryWorkload) -> None:
    workload.add("x", np.ones(2))
    with pytest.raises(AlreadyExistsError):
        workload.add("x", np.ones(2))
    with pytest.raises(InvalidArgumentError, match="Python objects"):
        workload.add("o", np.array([object()]))
    with pytest.raises(InvalidArgumentError, match="one string"):
        workload.add("t", np.ones(2), tags="weights")
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        workload.add("t", np.ones(2), tags=[])
    with pytest.raises(InvalidArgumentError, match="name"):
        workload.add("", np.ones(2))
    with pytest.raises(InvalidArgumentError, match="suspend mode"):
        workload.snapshot("hibernate")
    with pytest.raises(NotFoundError, match="'x'"):
        workload["y"]
    assert "x" in workload and "y" not in workload


def test_snapshot_and_restore_race_safely_with_a_reader(workload: HostMemoryWorkload) -> None:
    workload.add("x", np.arange(100_000, dtype=np.int64))
    expected = int(np.arange(100_000, dtype=np.int64).sum())
    sums: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                sums.append(int(workload["x"].sum()))
            except ArraySavedError:
                pass

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(50):
            workload.snapshot("offload")
            workload.restore()
    finally:
        stop.set()
        reader.join(10)
    assert sums and set(sums) == {expected}
    assert workload.state == "RUNNING"


def test_workloads_sharing_a_store_directory_keep_their_own_bytes(tmp_path: Path) -> None:
    first, second = HostMemoryWorkload(tmp_path), HostMemoryWorkload(tmp_path)
    first.allocate("weights", 1000, np.int32)[:] = 1
    second.allocate("weights", 1000, np.int32)[:] = 2
    second.snapshot()
    first.snapshot()  # the same array, the same count: a file of its own all the same
    first.restore()
    second.restore()
    assert np.all(first["weights"] == 1) and np.all(second["weights"] == 2)
    assert list(tmp_path.iterdir()) == []
    first.close()
    second.close()
