"""How `TorchWorkload` moves one tensor storage's bytes off its device and back.

The unit is a storage, not a tensor: tensors that are views of one storage
(tied or sliced weights, say) are saved together and come back as views of one
new storage, at the same offsets and strides, so that they still share memory.

Bytes move through a flat ``uint8`` view of the storage, in chunks of at most
``chunk_bytes``, so that a copy never needs a temporary of a whole tensor and
the bytes counted are the bytes copied. Host copies of CUDA storages are in
pinned memory (page-locked, so that the copies run at the bus's speed); every
CUDA copy is waited for before its source is freed or its destination used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef

log = logging.getLogger("timeslice.workloads.torch")


@dataclass(eq=False, kw_only=True)
class Held:
    """A tensor that a snapshot may take: where the workload found it, and its tags."""

    label: str
    tensor: torch.Tensor
    tags: frozenset[str]
    # For a gradient, its parameter: it comes back only while it is still `param.grad`.
    grad_of: torch.Tensor | None = None


@dataclass(eq=False, kw_only=True)
class SavedView:
    """One tensor of a saved storage: the object itself (kept, so that the very same
    object comes back) and how it lay in the storage."""

    label: str
    tags: frozenset[str]
    tensor: torch.Tensor
    grad_of: torch.Tensor | None
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    # The tensor's version counter once its memory was taken: a write while it is
    # saved (grad.zero_(), say) moves it.
    version: int = 0


@dataclass(eq=False, kw_only=True)
class SavedStorage:
    """A storage off its device: its bytes in host memory (None when discarded)."""

    device: torch.device
    nbytes: int
    host: torch.Tensor | None
    views: list[SavedView] = field(default_factory=list)

    @property
    def discarded(self) -> bool:
        return self.host is None


@dataclass(eq=False, kw_only=True)
class StorageGroup:
    """The live tensors of one storage, to be saved together."""

    device: torch.device
    nbytes: int
    members: list[Held]


def group_by_storage(held: Iterable[Held]) -> list[list[Held]]:
    """`held` grouped by the storage each tensor is a view of; tensors without bytes
    (nothing to move) are left out."""
    groups: dict[tuple[str, int], list[Held]] = {}
    for item in held:
        storage = item.tensor.untyped_storage()
        if storage.nbytes() == 0:
            continue
        key = (str(item.tensor.device), storage.data_ptr())
        groups.setdefault(key, []).append(item)
    return list(groups.values())


def storage_group(members: list[Held]) -> StorageGroup:
    """The group of `members`, which share one storage."""
    first = members[0].tensor
    return StorageGroup(
        device=first.device, nbytes=first.untyped_storage().nbytes(), members=members
    )


def synchronize(devices: Iterable[torch.device]) -> None:
    """Wait for every CUDA device among `devices` to finish its queued work."""
    for device in set(devices):
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def release_cached(devices: Iterable[torch.device]) -> None:
    """Give the CUDA caching allocator's free blocks back to the driver, so that
    another process can have the memory."""
    if any(device.type == "cuda" for device in devices):
        torch.cuda.empty_cache()


def save(group: StorageGroup, *, keep: bool, chunk_bytes: int) -> tuple[SavedStorage, int]:
    """Take the memory of `group`'s storage: copy its bytes to host memory first if
    `keep`, then point every member at an empty tensor of its own (the same object
    stays in the module, the optimizer or the caller's hands).

    Returns the saved storage and the device bytes freed: the storage's size when no
    reference to it remains, else 0 (a view, or an autograd graph, still holds it;
    the memory goes when that reference does).
    """
    storage = group.members[0].tensor.untyped_storage()
    gone = StorageWeakRef(storage)  # type: ignore[no-untyped-call]
    host = _copy_out(storage, group.device, chunk_bytes) if keep else None
    del storage
    saved = SavedStorage(device=group.device, nbytes=group.nbytes, host=host)
    with torch.no_grad():
        for item in group.members:
            tensor = item.tensor
            view = SavedView(
                label=item.label,
                tags=item.tags,
                tensor=tensor,
                grad_of=item.grad_of,
                dtype=tensor.dtype,
                size=tuple(tensor.size()),
                stride=tuple(tensor.stride()),
                offset=int(tensor.storage_offset()),
            )
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            view.version = tensor._version
            saved.views.append(view)
    if gone.expired():  # type: ignore[no-untyped-call]
        return saved, group.nbytes
    labels = ", ".join(repr(v.label) for v in saved.views)
    log.warning(
        "the memory of %s (%d bytes) is still referenced outside the workload (a view,"
        " or an autograd graph not yet run backward); it is freed only when that"
        " reference is dropped",
        labels,
        group.nbytes,
    )
    return saved, 0


def bring_back(saved: SavedStorage, views: list[SavedView], *, chunk_bytes: int) -> tuple[int, int]:
    """Give `views` (those of `saved` to restore) memory again: a new storage with
    the saved bytes, or zeros when discarded, except discarded gradients, which come
    back as None (`param.grad = None`, as `zero_grad()` leaves them).

    Returns ``(host bytes read, device bytes allocated)``.
    """
    if saved.discarded:
        for view in views:
            if view.grad_of is not None:
                view.grad_of.grad = None
        views = [v for v in views if v.grad_of is None]
    if not views:
        return 0, 0
    if saved.host is None:
        memory = torch.zeros(saved.nbytes, dtype=torch.uint8, device=saved.device)
        read = 0
    else:
        memory = _copy_in(saved.host, saved.device, chunk_bytes)
        read = saved.nbytes
    storage = memory.untyped_storage()
    del memory
    with torch.no_grad():
        for view in views:
            fresh = torch.empty(0, dtype=view.dtype, device=saved.device)
            fresh.set_(storage, view.offset, view.size, view.stride)
            if view.tensor._version != view.version:
                _written_while_saved(view, fresh)
            view.tensor.data = fresh
    return read, saved.nbytes


def _written_while_saved(view: SavedView, fresh: torch.Tensor) -> None:
    """A saved tensor was written in place while it had no memory: a gradient comes
    back as zeros (the one in-place write a training loop does to one is
    ``zero_grad(set_to_none=False)``); anything else keeps its saved bytes, and the
    write is lost."""
    if view.grad_of is not None:
        fresh.zero_()
        log.warning("gradient %r was written while saved; it comes back as zeros", view.label)
    else:
        log.warning(
            "tensor %r was written while saved; that write is lost (restore first)", view.label
        )


def _byte_view(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    flat = torch.empty(0, dtype=torch.uint8, device=device)
    return flat.set_(storage, 0, (storage.nbytes(),), (1,))


def _copy_out(
    storage: torch.UntypedStorage, device: torch.device, chunk_bytes: int
) -> torch.Tensor:
    source = _byte_view(storage, device)
    host = torch.empty(source.numel(), dtype=torch.uint8, pin_memory=device.type == "cuda")
    _copy_chunks(host, source, chunk_bytes, device)
    return host


def _copy_in(host: torch.Tensor, device: torch.device, chunk_bytes: int) -> torch.Tensor:
    memory = torch.empty(host.numel(), dtype=torch.uint8, device=device)
    _copy_chunks(memory, host, chunk_bytes, device)
    return memory


def _copy_chunks(
    target: torch.Tensor, source: torch.Tensor, chunk_bytes: int, device: torch.device
) -> None:
    asynchronous = device.type == "cuda"
    total = source.numel()
    for start in range(0, total, chunk_bytes):
        stop = min(start + chunk_bytes, total)
        target[start:stop].copy_(source[start:stop], non_blocking=asynchronous)
    if asynchronous:
        torch.cuda.synchronize(device)
